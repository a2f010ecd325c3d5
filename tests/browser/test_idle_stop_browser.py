"""Idle auto-stop in a real browser, on the real-process cluster (sampler, minute rollups, beat)."""

import pytest
from playwright.sync_api import expect

from portal.models import Instance
from tests.browser.test_monitor_browser import SCREENSHOTS, sign_in
from tests.conftest import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(360)]


@pytest.fixture
def cluster_env(cluster_env) -> dict:
    # The browser tests' settings, and checked every 2 s, stopped 5 s after the warning (instead of 60 s and 300 s).
    return {**cluster_env, "IDLE_CHECK_S": "2", "IDLE_WARNING_S": "5"}


def test_an_idle_instance_is_warned_about_then_stopped(page, cluster, catalog):
    base = f"http://127.0.0.1:{cluster.web_port}"
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, base, "alice", "alice-pass-123")
    page.goto(f"{base}/instances/new/")
    page.fill("#id_name", "sleepy")
    page.select_option("#id_gpu_type", str(catalog["rtx3090"].pk))
    page.select_option("#id_image", str(catalog["image"].pk))
    page.fill("#id_gpus", "1")  # a whole card: a fraction's own compute has no reading (MPS), never idle
    page.fill("#id_cpu_cores", "1")
    page.fill("#id_memory_gb", "1")
    page.fill("#id_idle_util_percent", "50")
    page.fill("#id_idle_minutes", "1")
    page.click("button:has-text('Create instance')")
    row = page.locator("tr", has=page.get_by_role("link", name="sleepy", exact=True))
    expect(row).to_contain_text("Running", timeout=60_000)
    instance = Instance.objects.get(name="sleepy")

    # A whole idle minute of samples first: the warning is set by the periodic check, shown on the next load.
    def warned() -> bool:
        page.reload()
        return page.locator("[data-stop-warning]").count() > 0

    wait_for(warned, timeout=200, what="the idle warning in the list")
    expect(row.locator("[data-stop-warning]")).to_contain_text("unless its GPUs get busy")
    page.screenshot(path=f"{SCREENSHOTS}/idle-warning.png", full_page=True)
    expect(row).to_contain_text("Stopped", timeout=60_000)  # pushed live when it stops
    expect(row).to_contain_text("idle: GPU below 50% for 1 min")
    instance.workload.refresh_from_db()
    assert instance.workload.status == "stopped"
