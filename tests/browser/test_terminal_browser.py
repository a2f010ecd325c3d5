"""The web terminal in a real browser: xterm.js, a command typed, its output from the real container, and why it
closed when the instance stops."""

import pytest
from playwright.sync_api import expect

from portal.models import Instance
from scheduler.services.workloads import workload_stop
from tests.browser.test_monitor_browser import SCREENSHOTS, sign_in
from tests.conftest import wait_status
from tests.portal.test_instance_api import create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SCREEN = """() => { const b = window.gpucloudTerminal.buffer.active; let t = "";
  for (let i = 0; i < b.length; i++) t += b.getLine(i).translateToString(true) + "\\n"; return t; }"""


def test_the_owner_types_a_command_in_the_browser_terminal_and_sees_its_output(
    page, api, catalog, node_worker, web_server
):
    assert create(api, catalog).status_code == 201
    instance = Instance.objects.get()
    wait_status(instance.workload, "running", timeout=30)
    sign_in(page, f"http://{web_server}", "alice", "alice-pass-123")
    page.goto(f"http://{web_server}/instances/{instance.pk}/terminal/")
    expect(page.locator("#conn")).to_have_text("connected", timeout=15_000)
    page.locator(".xterm").click()
    page.keyboard.type("echo from-the-browser-$((6*7)); hostname\n")
    page.wait_for_function(f"() => ({SCREEN})().includes('from-the-browser-42')", timeout=15_000)
    page.screenshot(path=f"{SCREENSHOTS}/terminal.png")
    workload_stop(instance.workload)
    expect(page.locator("#conn")).to_have_text("closed: the instance stopped", timeout=30_000)
    page.wait_for_function(f"() => ({SCREEN})().includes('[closed: the instance stopped]')", timeout=5_000)
