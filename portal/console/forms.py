"""The console's create forms (instances, jobs); the services do the real checks."""

from decimal import Decimal

from django import forms
from django.utils.translation import gettext_lazy as _

from portal import limits
from portal.models import BillingMode
from scheduler.policy import SHARE_FRACTIONS


def _gpus_field(max_digits: int, **options) -> forms.DecimalField:
    """Cards, a number offered from a list (templates/portal/_gpu_sizes.html): the fractions of a card on
    offer (a card serves one share size at a time), then whole cards. Another fraction is refused at the
    field (by the service)."""
    return forms.DecimalField(
        label=_("GPUs"),
        max_digits=max_digits,
        decimal_places=3,
        initial=Decimal("1"),
        min_value=min(SHARE_FRACTIONS),
        widget=forms.NumberInput(attrs={"list": "gpu-sizes", "step": "any"}),
        **options,
    )


class WorkForm(forms.Form):
    """What instances and jobs ask for alike (as the API's WorkInput): image, GPUs, CPU and memory."""

    name = forms.CharField(label=_("Name"), max_length=limits.NAME_CHARS)
    gpu_type = forms.TypedChoiceField(coerce=int, label=_("GPU type"))
    image = forms.TypedChoiceField(label=_("Image"), coerce=int)
    gpus = _gpus_field(4)
    share_fractions = SHARE_FRACTIONS  # the pages offer them as the list of sizes
    cpu_cores = forms.IntegerField(
        label=_("CPU cores"),
        min_value=limits.CPU_CORES.min,
        max_value=limits.CPU_CORES.max,
        initial=limits.DEFAULT_CPU_CORES,
    )
    memory_gb = forms.IntegerField(
        label=_("Memory (GB)"),
        min_value=limits.MEMORY_GB.min,
        max_value=limits.MEMORY_GB.max,
        initial=limits.DEFAULT_MEMORY_GB,
    )

    team = forms.ChoiceField(label=_("Charge to"), required=False)

    def __init__(self, *args, gpu_types, images, teams=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [("", _("My wallet"))] + [
            (t.slug, _("Team %(name)s") % {"name": t.name}) for t in teams
        ]
        self.fields["gpu_type"].choices = [(t.pk, _gpu_type_label(t)) for t in gpu_types]
        groups = {"official": _("Official"), "community": _("Community"), "private": _("My images")}
        self.fields["image"].choices = [
            (label, [(i.pk, _image_label(i)) for i in images if i.visibility == key])
            for key, label in groups.items()
            if any(i.visibility == key for i in images)
        ]


def _gpu_type_label(t) -> str:
    label = _("%(name)s — %(price)s %(currency)s/card-hour, %(free)s of %(cards)s cards free") % {
        "name": t.display_name,
        "price": t.price_per_hour,
        "currency": t.currency,
        "free": t.capacity["free_cards"],
        "cards": t.capacity["cards"],
    }
    return label + (_(" (simulated)") if t.capacity["simulated"] else "")


def _image_label(image) -> str:
    if image.visibility == "private" and image.node is None:
        return _("%(name)s (saved, in the registry)") % {"name": image.name}
    if image.visibility == "private":
        return _("%(name)s (saved, on %(node)s)") % {"name": image.name, "node": image.node.name}
    label = f"{image.name} (CUDA {image.cuda_version})" if image.cuda_version else image.name
    return label if image.status == "ready" else f"{label} — {image.get_status_display()}: {image.status_reason}"


class InstanceCreateForm(WorkForm):
    name = forms.CharField(label=_("Name"), max_length=limits.NAME_CHARS, initial="my-instance")
    disk_gb = forms.IntegerField(
        label=_("Data disk (GB)"), min_value=limits.DISK_GB.min, max_value=limits.DISK_GB.max, initial=50
    )
    billing_mode = forms.ChoiceField(label=_("Billing"), choices=BillingMode.choices, initial=BillingMode.ON_DEMAND)
    idle_util_percent = forms.IntegerField(
        label=_("Stop when idle: GPU below (%)"),
        min_value=1,
        max_value=100,
        required=False,
        help_text=_("Empty: never stop for idleness."),
    )
    idle_minutes = forms.IntegerField(
        label=_("… for (minutes)"),
        min_value=limits.IDLE_MINUTES.min,
        max_value=limits.IDLE_MINUTES.max,
        initial=limits.DEFAULT_IDLE_MINUTES,
        required=False,
    )


class JobCreateForm(WorkForm):
    field_order = ["name", "gpu_type", "image", "gpus", "nodes", "elastic_min", "elastic_max", "command"]

    gpus = _gpus_field(
        6, help_text=_("More cards than one node has: the job runs over several nodes, one container on each.")
    )
    nodes = forms.IntegerField(
        label=_("Nodes (optional)"),
        min_value=1,
        max_value=limits.MAX_NODES,
        required=False,
        help_text=_("Exactly this many nodes, GPUs ÷ nodes cards on each; CPU and memory are per node."),
    )

    elastic_min = forms.IntegerField(
        label=_("Elastic: fewest cards (optional)"),
        min_value=1,
        max_value=limits.MAX_JOB_CARDS,
        required=False,
        help_text=_(
            "With the most cards: an elastic job of whole cards. It starts at GPUs if that fits, else at this; grows "
            "into idle cards and shrinks back when queued work needs them, each resize a restart from its checkpoint."
        ),
    )
    elastic_max = forms.IntegerField(
        label=_("Elastic: most cards (optional)"), min_value=1, max_value=limits.MAX_JOB_CARDS, required=False
    )

    name = forms.CharField(label=_("Name"), max_length=limits.NAME_CHARS, initial="train")
    command = forms.CharField(
        label=_("Command"),
        max_length=limits.COMMAND_CHARS,
        widget=forms.Textarea(attrs={"rows": 4}),
        initial="python train.py --ckpt $GPUCLOUD_CHECKPOINT_DIR",
    )
    priority = forms.TypedChoiceField(
        label=_("Priority"), coerce=int, choices=[(0, _("High")), (1, _("Normal")), (2, _("Low"))], initial=1
    )
    max_runtime_s = forms.IntegerField(
        label=_("Max runtime (s)"),
        min_value=limits.MAX_RUNTIME_S.min,
        max_value=limits.MAX_RUNTIME_S.max,
        required=False,
    )
    env = forms.CharField(
        label=_("Environment"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "LR=3e-4\nEPOCHS=10"}),
        help_text=_("One NAME=value per line."),
    )
    spot = forms.BooleanField(
        label=_("Run on spot capacity (cheaper; on-demand work may evict it, it resumes from its checkpoint)"),
        required=False,
    )
    array = forms.CharField(
        label=_("Array (optional)"),
        required=False,
        max_length=255,
        widget=forms.TextInput(attrs={"placeholder": "0-31%4"}),
        help_text=_(
            "One task per index, as Slurm's --array: 0-31%4 runs tasks 0 to 31, at most 4 at once. "
            "Each task gets GPUCLOUD_ARRAY_INDEX and SLURM_ARRAY_TASK_ID."
        ),
    )

    def clean_env(self) -> dict:
        env = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(_("Line %(n)s: write NAME=value.") % {"n": number})
            env[name.strip()] = value
        return env
