from django.db import migrations, models


def spot_from_workloads(apps, schema_editor):
    """Segments recorded before segments knew: spot as their work is now (nothing changed it before)."""
    MeterSegment = apps.get_model("billing", "MeterSegment")
    MeterSegment.objects.filter(workload__spot=True).update(spot=True)


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0006_shared_storage_usage'),
        ('scheduler', '0010_moves'),
    ]

    operations = [
        migrations.AddField(
            model_name='metersegment',
            name='spot',
            field=models.BooleanField(default=False, help_text='Ran on spot capacity: the spot price (its work may have fallen back since).'),
        ),
        migrations.RunPython(spot_from_workloads, migrations.RunPython.noop),
    ]
