"""The console in a real browser: sign in, rent a GPU, watch it start live, stop it."""

import pytest
from playwright.sync_api import expect

from agent.launcher import docker_client
from portal.models import Instance

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_user_rents_a_fraction_and_sees_it_start_without_reloading(page, user, catalog, node_worker, web_server):
    base = f"http://{web_server}"
    page.goto(f"{base}/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "alice-pass-123")
    page.click("button.primary")
    expect(page.get_by_role("heading", name="My instances")).to_be_visible()

    page.click("text=Rent a GPU >> nth=0")
    page.fill("#id_gpus", "1.5")
    page.click("button:has-text('Create instance')")
    expect(page.locator('[data-field="gpus"]')).to_contain_text("not possible")
    assert not Instance.objects.exists()

    page.fill("#id_name", "notebook")
    page.select_option("#id_gpu_type", str(catalog["rtx3090"].pk))
    page.select_option("#id_image", str(catalog["image"].pk))
    page.fill("#id_gpus", "0.5")
    page.fill("#id_cpu_cores", "1")
    page.fill("#id_memory_gb", "1")
    page.click("button:has-text('Create instance')")
    # The create, then the instance list: on CI's 2 cores beside the several-host suite this took over 10 s once.
    expect(page.locator("#live-state")).to_have_text("Live updates: on", timeout=30_000)
    row = page.locator("tr", has_text="notebook")
    expect(row).to_contain_text("Running", timeout=30_000)  # pushed over the WebSocket, no reload
    expect(row).to_contain_text("simulated")
    page.screenshot(path="var/log/browser-instances.png", full_page=True)

    instance = Instance.objects.get()
    assert docker_client().containers.get(instance.workload.container_name).status == "running"
    row.get_by_role("button", name="Stop").click()
    expect(page.locator("tr", has_text="notebook")).to_contain_text("Stopped", timeout=30_000)
