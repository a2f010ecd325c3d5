"""The Logs tab in a real browser: an instance's output followed live, searched in the page, downloadable."""

import pytest
from playwright.sync_api import expect

from portal.models import Instance
from tests.browser.test_monitor_browser import SCREENSHOTS, sign_in
from tests.conftest import wait_status
from tests.portal.test_instance_api import create
from tests.portal.test_logs import logs_node  # noqa: F401  (a fixture: the node's log collector)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
TICKING = "echo instance up; i=0; trap 'exit 0' TERM; while :; do i=$((i+1)); echo tick $i; sleep 0.5; done"


def test_the_owner_follows_searches_and_downloads_an_instances_log(page, api, catalog, logs_node, web_server, settings):  # noqa: F811
    settings.INSTANCE_IDLE_COMMAND = ["sh", "-c", TICKING]
    assert create(api, catalog).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running", timeout=30)
    sign_in(page, f"http://{web_server}", "alice", "alice-pass-123")
    page.goto(f"http://{web_server}/instances/{instance.pk}/")
    page.locator("[data-instance-tabs]").get_by_text("Logs").click()
    lines = page.locator("[data-logs-lines]")
    expect(page.locator("[data-logs-state]")).to_have_text("live", timeout=15_000)
    expect(lines).to_contain_text("instance up", timeout=15_000)
    expect(lines).to_contain_text("tick 6", timeout=15_000)  # printed after the page opened: followed live
    # A term only the first line holds, however far the ticks have gone ("tick 2" also matched "tick 20" to "tick 29"
    # on a loaded machine, 10 s later), and the lines that keep arriving stay hidden.
    page.fill("[data-logs-search]", "instance up")
    expect(page.locator("[data-logs-lines] span:not([hidden])")).to_have_count(1)
    expect(page.locator("[data-logs-count]")).to_have_text("1 line matches")
    expect(lines.get_by_text("tick 3", exact=True)).to_be_hidden()
    expect(lines.get_by_text("instance up", exact=True)).to_be_visible()
    page.screenshot(path=f"{SCREENSHOTS}/logs.png")
    href = page.locator("[data-logs-download]").get_attribute("href")
    assert href == f"/api/v1/instances/{instance.pk}/logs/?format=text&download=1"
    download = page.request.get(f"http://{web_server}{href}")
    assert download.ok and download.text().splitlines()[0] == "instance up"
