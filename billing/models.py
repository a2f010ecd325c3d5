"""Metering: one segment per stretch of time a workload really ran."""

from django.db import models
from django.db.models import Q

from scheduler.models import Workload


class MeterSegment(models.Model):
    """Opened when the container is really running, closed when it really stops."""

    workload = models.ForeignKey(Workload, on_delete=models.PROTECT, related_name="meter_segments")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["started_at"]
        constraints = [
            models.UniqueConstraint(fields=["workload"], condition=Q(ended_at__isnull=True), name="one_open_segment"),
            models.UniqueConstraint(fields=["workload", "started_at"], name="one_segment_per_run"),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=models.F("started_at")),
                name="segment_ends_after_start",
            ),
        ]

    def __str__(self):
        return f"{self.workload_id}: {self.started_at} .. {self.ended_at or 'open'}"

    @property
    def seconds(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.started_at).total_seconds()
