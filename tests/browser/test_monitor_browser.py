"""The live GPU monitor in a real browser: an instance's charts move, and staff see the cluster grid.

The instance holds half a card: as on a real host (MPS), its own compute is not measurable, so the page shows
the card's utilization, its own memory and the sentence saying why, never 0 %."""

import pytest
from playwright.sync_api import expect

from agent.launcher import docker_client
from portal.models import Instance
from tests.conftest import wait_status

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]
SCREENSHOTS = "docs/screenshots"


def sign_in(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button.primary")


def test_the_instance_monitor_charts_move_and_the_cluster_grid_shows_who_holds_what(
    page, browser, cluster, catalog, user, django_user_model
):
    base = f"http://127.0.0.1:{cluster.web_port}"
    workload = cluster.create_instance(catalog, gpus="0.5")
    wait_status(workload, "running", timeout=60)
    instance = Instance.objects.get(workload=workload)
    container = docker_client().containers.get(workload.container_name)
    container.exec_run(["sh", "-c", "while :; do :; done"], detach=True)  # a busy "GPU"

    sign_in(page, base, "alice", "alice-pass-123")
    page.get_by_role("link", name="Monitor").click()
    expect(page.locator("#conn")).to_have_text("live", timeout=15_000)
    expect(page.locator("h1 .badge")).to_have_text("simulated GPU")
    util_chart = page.locator('[data-chart="util"]')
    page.wait_for_function("() => +document.querySelector('[data-chart=\"util\"]').dataset.points >= 3", timeout=20_000)
    before = int(util_chart.get_attribute("data-points"))
    page.wait_for_function(
        f"() => +document.querySelector('[data-chart=\"util\"]').dataset.points > {before}", timeout=10_000
    )
    expect(page.locator("#smi")).to_contain_text("share 0.50")
    expect(page.locator("#smi")).to_contain_text("simulated GPU")
    expect(page.locator("#smi")).to_contain_text("util not measurable (shared card)")
    expect(page.locator("#smi")).not_to_contain_text("util 0% of share")
    expect(page.locator("[data-util-absent]")).to_be_visible()
    expect(page.locator("[data-util-absent]")).to_contain_text("not measurable on a shared card")
    page.wait_for_function("() => /card util [1-9]/.test(document.querySelector('#smi').textContent)", timeout=20_000)
    expect(util_chart.locator("canvas")).to_have_count(1)
    expect(util_chart).to_contain_text("GPU0 card")
    page.screenshot(path=f"{SCREENSHOTS}/instance-monitor.png", full_page=True)

    django_user_model.objects.create_user("ops", password="ops-pass-123", is_staff=True)
    staff_page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    sign_in(staff_page, base, "ops", "ops-pass-123")
    staff_page.get_by_role("link", name="Cluster").click()
    expect(staff_page.locator("#conn")).to_have_text("live", timeout=15_000)
    node = staff_page.locator(f'[data-node="{cluster.node_name}"]')
    expect(node).to_contain_text("simulated")
    held = node.locator(f'[data-workload="{workload.pk}"]')
    expect(held).to_contain_text("alice")
    own = held.locator('[data-held="util"]')
    expect(own).to_contain_text("own compute not measurable on a shared card", timeout=10_000)
    expect(own).to_contain_text("MiB")
    card = node.locator("tr[data-uuid]", has=staff_page.locator(f'[data-workload="{workload.pk}"]'))
    expect(card.locator('[data-field="power"]')).to_contain_text("W")
    expect(card.locator('[data-field="util"]')).to_contain_text("%")
    staff_page.screenshot(path=f"{SCREENSHOTS}/cluster-monitor.png", full_page=True)
    assert (
        held.get_by_role("link", name=instance.name, exact=True)
        .get_attribute("href")
        .endswith(f"/instances/{instance.pk}/monitor/")
    )
