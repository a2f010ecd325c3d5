"""Fixtures for the billing tests."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import RateCard


@pytest.fixture
def today():
    return timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def card(today):
    """The rate card for storage: 0.50 per GB-day above 20 GB free."""
    return RateCard.objects.create(
        gpu_model="", effective_from=today - timedelta(days=30), storage_gb_day=Decimal("0.50"), free_storage_gb=20
    )
