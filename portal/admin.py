"""Admin for the catalog and instances."""

from django.contrib import admin

from core.admin import ReadOnlyAdmin
from portal.models import AuditEntry, GpuType, Image, Instance, Job


@admin.register(GpuType)
class GpuTypeAdmin(admin.ModelAdmin):
    list_display = ["name", "display_name", "memory_gb", "price_per_hour", "spot_price_per_hour", "currency", "active"]


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["name", "framework", "framework_version", "cuda_version", "docker_ref", "visibility", "owner"]
    list_filter = ["framework", "visibility"]


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "gpu_type", "gpus", "billing_mode", "status", "created_at"]
    list_filter = ["billing_mode", "gpu_type"]
    raw_id_fields = ["workload"]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "gpu_type", "gpus", "created_at"]
    raw_id_fields = ["workload"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """Powers used over other people's work and teams: written by the services that used them, never changed here."""

    list_display = ["created_at", "actor", "action", "target", "owner", "team"]
    list_filter = ["action"]
    search_fields = ["actor__username", "owner__username", "team", "target"]
