"""Admin for the cluster: nodes, cards, workloads, allocations, events (mostly read-only)."""

from django.contrib import admin

from scheduler.models import Allocation, Gpu, GpuMinute, Node, Quota, Workload, WorkloadEvent, WorkloadGpuMinute


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    readonly_fields = ["index", "uuid", "model", "memory_mb", "allocated_milli", "allocated_memory_mb"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "status", "simulated", "cpu_cores", "allocated_cpu", "memory_mb", "last_heartbeat"]
    list_filter = ["status", "simulated"]
    readonly_fields = ["allocated_cpu", "allocated_memory_mb", "last_heartbeat", "registered_at"]
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "uuid", "model", "memory_mb", "allocated_milli", "allocated_memory_mb"]
    list_filter = ["model", "node"]
    readonly_fields = ["allocated_milli", "allocated_memory_mb"]


class EventInline(admin.TabularInline):
    model = WorkloadEvent
    extra = 0
    readonly_fields = ["from_status", "to_status", "reason", "created_at"]


@admin.register(Workload)
class WorkloadAdmin(admin.ModelAdmin):
    list_display = ["id", "kind", "name", "owner", "status", "gpu_model", "gpu_count", "gpu_milli", "node"]
    list_filter = ["kind", "status", "gpu_model"]
    search_fields = ["name", "owner__username"]
    readonly_fields = ["status", "status_reason", "node", "container_id", "exit_code", "started_at", "finished_at"]
    inlines = [EventInline]


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
