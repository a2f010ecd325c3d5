"""Admin for the catalog and instances."""

from django.contrib import admin

from portal.models import GpuType, Image, Instance, Job


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
