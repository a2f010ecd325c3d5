"""The staff groups: a staff account has no power over other people's work until it joins one (or is given the
permissions one by one). Their permissions are made here, not left to post_migrate, so the groups hold them at once."""

from django.db import migrations

GROUPS = {
    "Support": [("scheduler", "workload", "view_any_work")],
    "Operators": [("scheduler", "workload", "view_any_work"), ("scheduler", "workload", "operate_any_work")],
    "Billing": [
        ("billing", "posting", "top_up"),
        ("billing", "account", "view_account"),
        ("billing", "team", "view_team"),
        ("billing", "team", "change_team"),
    ],
}
NAMES = {
    "view_any_work": "Can see every user's instances, jobs and arrays",
    "operate_any_work": "Can stop, start, restart, release, move, grow or save anyone's work",
    "top_up": "Can top up, credit or refund a wallet",
    "view_account": "Can view account",
    "view_team": "Can view team",
    "change_team": "Can change team",
}


def groups_make(apps, schema_editor):
    Group, Permission = apps.get_model("auth", "Group"), apps.get_model("auth", "Permission")
    ContentType = apps.get_model("contenttypes", "ContentType")
    for name, permissions in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        for app_label, model, codename in permissions:
            content_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
            permission, _ = Permission.objects.get_or_create(
                content_type=content_type, codename=codename, defaults={"name": NAMES[codename]}
            )
            group.permissions.add(permission)


def groups_drop(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=GROUPS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0011_staff_powers"),
        ("scheduler", "0022_staff_powers"),
        ("billing", "0015_team_invitations"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(groups_make, groups_drop)]
