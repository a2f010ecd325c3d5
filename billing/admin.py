"""Admin for billing."""

from django.contrib import admin

from billing.models import MeterSegment


@admin.register(MeterSegment)
class MeterSegmentAdmin(admin.ModelAdmin):
    list_display = ["workload", "started_at", "ended_at", "end_reason"]
    list_filter = ["ended_at"]
    readonly_fields = ["workload", "started_at", "ended_at", "end_reason"]
