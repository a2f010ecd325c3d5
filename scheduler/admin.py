"""Admin for the cluster: nodes, cards, workloads, allocations, events (mostly read-only)."""

from django.conf import settings
from django.contrib import admin, messages

from core.errors import ServiceError
from core.powers import READ_WORK_ENV
from scheduler.models import (
    Allocation,
    Gpu,
    GpuMinute,
    Node,
    Quota,
    Workload,
    WorkloadEvent,
    WorkloadGpuMinute,
    WorkloadSpec,
)
from scheduler.services.nodes import node_activate, node_drain, node_remove


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    readonly_fields = ["index", "uuid", "model", "memory_mb", "allocated_milli", "allocated_memory_mb"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "status",
        "address",
        "simulated",
        "cpu_cores",
        "allocated_cpu",
        "memory_mb",
        "last_heartbeat",
        "drain_deadline",
    ]
    list_filter = ["status", "simulated"]
    readonly_fields = [
        "status",
        "address",
        "relay_url",
        "allocated_cpu",
        "allocated_memory_mb",
        "last_heartbeat",
        "registered_at",
        "drain_deadline",
        "epoch",
    ]
    inlines = [GpuInline]
    actions = ["drain", "activate", "remove"]

    def _each(self, request, queryset, verb: str, action) -> None:
        for node in queryset:
            try:
                action(node)
                self.message_user(request, f"{node.name}: {verb}")
            except ServiceError as exc:
                self.message_user(request, f"{node.name}: {exc.message}", level=messages.ERROR)

    @admin.action(description="Drain: place nothing new; stop what still runs after DRAIN_NOTICE_S")
    def drain(self, request, queryset):
        self._each(request, queryset, "draining", lambda node: node_drain(node=node, notice_s=settings.DRAIN_NOTICE_S))

    @admin.action(description="Activate: take a draining or drained node back into service")
    def activate(self, request, queryset):
        self._each(request, queryset, "active", lambda node: node_activate(node=node))

    @admin.action(description="Remove a drained or lost node (refused while instances keep disks there)")
    def remove(self, request, queryset):
        self._each(request, queryset, "removed", lambda node: node_remove(node=node))


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "uuid", "model", "memory_mb", "allocated_milli", "allocated_memory_mb"]
    list_filter = ["model", "node"]
    readonly_fields = ["allocated_milli", "allocated_memory_mb"]


class EventInline(admin.TabularInline):
    model = WorkloadEvent
    extra = 0
    readonly_fields = ["from_status", "to_status", "reason", "created_at"]


class SpecInline(admin.StackedInline):
    """What it runs and its environment: shown (read only) to whoever may read another's environment."""

    model = WorkloadSpec
    can_delete = False
    readonly_fields = ["command", "env"]

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(READ_WORK_ENV)

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Workload)
class WorkloadAdmin(admin.ModelAdmin):
    list_display = ["id", "kind", "name", "owner", "status", "gpu_model", "gpu_count", "gpu_milli", "node"]
    list_filter = ["kind", "status", "gpu_model"]
    search_fields = ["name", "owner__username"]
    readonly_fields = ["status", "status_reason", "node", "container_id", "exit_code", "started_at", "finished_at"]
    inlines = [EventInline, SpecInline]  # the spec's only where it may be viewed (the admin skips it otherwise)


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ["workload", "gpu", "milli", "memory_mb", "created_at"]


@admin.register(WorkloadEvent)
class WorkloadEventAdmin(admin.ModelAdmin):
    list_display = ["workload", "from_status", "to_status", "reason", "created_at"]
    list_filter = ["to_status"]


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["__str__", "user", "team", "max_cards"]


class MinuteAdmin(admin.ModelAdmin):
    """Minute rollups are written by node agents only: read-only here."""

    date_hierarchy = "minute"
    list_filter = ["gpu__model", "gpu__node"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(GpuMinute)
class GpuMinuteAdmin(MinuteAdmin):
    list_display = ["minute", "gpu", "samples", "util_avg", "util_max", "mem_max_mb", "power_avg_w"]


@admin.register(WorkloadGpuMinute)
class WorkloadGpuMinuteAdmin(MinuteAdmin):
    list_display = ["minute", "workload", "gpu", "samples", "util_avg", "util_max", "mem_max_mb"]
    list_select_related = ["workload", "gpu__node"]
