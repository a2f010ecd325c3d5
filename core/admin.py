"""Admin pieces every app's admin uses."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the platform writes (postings, requests, audit entries): listed and read here, never added, changed or
    deleted by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
