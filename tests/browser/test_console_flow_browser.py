"""The whole console in a real browser, as a user goes through it.

Create an instance with a fraction of a card from the form, watch it run, type in
its terminal, upload a file, stop it, save it as an image, create a new instance
from that image and find the file there, release both; switch the language to
Chinese; an outsider's direct URLs get 404 and a refused socket. Screenshots of
each page go to docs/screenshots/.
"""

import pytest
from playwright.sync_api import expect

from agent.launcher import docker_client
from portal.models import Image, Instance
from tests.browser.test_monitor_browser import SCREENSHOTS, sign_in
from tests.browser.test_terminal_browser import SCREEN
from tests.conftest import wait_status

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def create_from_form(page, base: str, name: str, *, image_id: int, gpu_type_id: int, preselected=False) -> Instance:
    if not preselected:
        page.goto(f"{base}/instances/new/")
        page.select_option("#id_image", str(image_id))
    expect(page.locator("#id_image")).to_have_value(str(image_id))
    page.fill("#id_name", name)
    page.select_option("#id_gpu_type", str(gpu_type_id))
    page.fill("#id_gpus", "0.5")
    page.fill("#id_cpu_cores", "1")
    page.fill("#id_memory_gb", "1")
    page.fill("#id_disk_gb", "10")
    page.click("button:has-text('Create instance')")
    expect(page.locator(".flash")).to_contain_text(f"Instance {name} created")
    row = page.locator("tr", has=page.get_by_role("link", name=name, exact=True))
    expect(row).to_contain_text("Running", timeout=30_000)  # live, over the WebSocket
    return Instance.objects.get(name=name)


def terminal_run(page, base: str, instance: Instance, command: str, expected: str) -> None:
    page.goto(f"{base}/instances/{instance.pk}/terminal/")
    expect(page.locator("#conn")).to_have_text("connected", timeout=15_000)
    page.locator(".xterm").click()
    page.keyboard.type(command + "\n")
    page.wait_for_function(f"() => ({SCREEN})().includes({expected!r})", timeout=15_000)


def stop_from_instance_page(page, base: str, instance: Instance) -> None:
    page.goto(f"{base}/instances/{instance.pk}/")
    expect(page.locator("#live-state")).to_have_text("Live updates: on", timeout=10_000)
    page.get_by_role("button", name="Stop", exact=True).click()
    expect(page.locator("[data-status]")).to_have_text("Stopped", timeout=30_000)  # the page follows it live


def release_from_list(page, base: str, instance: Instance) -> None:
    page.goto(f"{base}/")
    row = page.locator(f'tr[data-instance="{instance.pk}"]')
    page.once("dialog", lambda dialog: dialog.accept())  # "Release deletes the container, its system disk …"
    row.get_by_role("button", name="Release").click()
    wait_status(instance.workload, "released", timeout=30)


def test_a_user_gets_into_an_instance_saves_it_as_an_image_and_reuses_it(
    page, browser, user, outsider, catalog, node_worker, web_server
):
    base = f"http://{web_server}"
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, base, "alice", "alice-pass-123")
    expect(page.get_by_role("heading", name="My instances", exact=True)).to_be_visible()
    first = create_from_form(page, base, "env", image_id=catalog["image"].pk, gpu_type_id=catalog["rtx3090"].pk)
    page.screenshot(path=f"{SCREENSHOTS}/instances.png", full_page=True)

    # The instance page, its terminal and its files.
    page.get_by_role("link", name="env", exact=True).click()
    expect(page.locator("[data-status]")).to_have_text("Running")
    expect(page.locator("[data-instance-tabs]")).to_contain_text("Terminal")
    page.screenshot(path=f"{SCREENSHOTS}/instance-page.png", full_page=True)
    terminal_run(page, base, first, "echo made-in-terminal > /root/term.txt; echo ok-$((6*7))", "ok-42")
    page.goto(f"{base}/instances/{first.pk}/files/?path=/root")
    page.set_input_files("input[name=file]", {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"my notes\n"})
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.locator(".flash")).to_contain_text("Uploaded")
    expect(page.locator('[data-entry="notes.txt"]')).to_be_visible()
    expect(page.locator('[data-entry="term.txt"]')).to_be_visible()
    page.screenshot(path=f"{SCREENSHOTS}/files.png", full_page=True)
    container = docker_client().containers.get(first.workload.container_name)
    assert container.exec_run(["cat", "/root/notes.txt"]).output == b"my notes\n"

    # Stop, save as image, watch it become ready.
    stop_from_instance_page(page, base, first)
    page.fill("#save-image input[name=name]", "my-env")
    page.get_by_role("button", name="Save as image").click()
    expect(page.get_by_role("heading", name="Images", exact=True)).to_be_visible()
    saved = page.locator("[data-image]", has_text="my-env")
    expect(saved.locator("[data-image-status]")).to_have_text("Ready", timeout=60_000)  # htmx polls while saving
    page.screenshot(path=f"{SCREENSHOTS}/images.png", full_page=True)
    image = Image.objects.get(name="my-env")

    # A new instance from it has the files of the system disk.
    saved.get_by_role("link", name="New instance").click()
    expect(page.locator("#id_image")).to_have_value(str(image.pk))
    gpu_type = catalog["rtx3090"].pk
    second = create_from_form(page, base, "from-image", image_id=image.pk, gpu_type_id=gpu_type, preselected=True)
    terminal_run(page, base, second, "cat /root/notes.txt /root/term.txt", "made-in-terminal")
    assert "my notes" in page.evaluate(SCREEN)
    page.screenshot(path=f"{SCREENSHOTS}/terminal.png")

    # An outsider's direct URLs: 404 pages and a refused terminal socket.
    other = browser.new_context().new_page()
    sign_in(other, base, "mallory", "mallory-pass-123")
    for path in (f"/instances/{second.pk}/", f"/instances/{second.pk}/files/", f"/instances/{second.pk}/terminal/"):
        assert other.goto(f"{base}{path}").status == 404, path
    code = other.evaluate(
        """(url) => new Promise(done => { const ws = new WebSocket(url); ws.onclose = e => done(e.code); })""",
        f"ws://{web_server}/ws/terminal/instances/{second.pk}/",
    )
    assert code == 4404

    # Release both (the second is stopped first); the saved image stays until deleted.
    stop_from_instance_page(page, base, second)
    release_from_list(page, base, second)
    release_from_list(page, base, first)
    assert Image.objects.get(pk=image.pk).status == "ready"

    # The same pages in Chinese.
    page.goto(f"{base}/")
    page.select_option("[data-language] select", "zh-hans")
    expect(page.get_by_role("heading", name="我的实例", exact=True)).to_be_visible()
    expect(page.locator("header nav")).to_contain_text("租用 GPU")
    page.goto(f"{base}/images/")
    expect(page.get_by_role("heading", name="我的镜像", exact=True)).to_be_visible()
    expect(saved.locator("[data-image-status]")).to_have_text("可用")
    page.screenshot(path=f"{SCREENSHOTS}/images-zh.png", full_page=True)
    page.goto(f"{base}/instances/new/")
    expect(page.get_by_role("heading", name="GPU 市场", exact=True)).to_be_visible()
    page.screenshot(path=f"{SCREENSHOTS}/instance-create-zh.png", full_page=True)


def test_the_create_form_scales_cpu_and_memory_with_the_cards_and_the_helper_fills_it_in(
    page, api, user, catalog, sim_node, web_server
):
    base = f"http://{web_server}"
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, base, "alice", "alice-pass-123")
    page.goto(f"{base}/instances/new/")
    page.select_option("#id_gpu_type", str(catalog["rtx3090"].pk))
    page.fill("#id_gpus", "0.5")
    # 8 cores and 32 GB come with each card: half a card gets 4 and 16 (the node has 8 and 16 GB).
    expect(page.locator("#id_cpu_cores")).to_have_value("4")
    expect(page.locator("#id_memory_gb")).to_have_value("16")
    expect(page.locator("[data-allotment]")).to_contain_text("8 cores and 32 GB")
    page.fill("#id_memory_gb", "3")  # set by hand: the cards no longer move it
    page.fill("#id_gpus", "1")
    expect(page.locator("#id_cpu_cores")).to_have_value("8")
    expect(page.locator("#id_memory_gb")).to_have_value("3")
    expect(page.locator(f'[data-market="{catalog["rtx3090"].pk}"] [data-node-free]')).to_contain_text("2 free")

    wanted = api.get("/api/v1/gpu-types/recommend/", {"model_params_b": 13, "precision": "bf16", "task": "inference"})
    page.fill("#recommend input[name=model_params_b]", "13")
    page.select_option("#recommend select[name=task]", "inference")
    page.get_by_role("button", name="Recommend and fill in").click()
    expect(page.locator("[data-recommendation]")).to_contain_text(wanted.data["gpu_type"]["display_name"])
    expect(page.locator("#id_gpu_type")).to_have_value(str(wanted.data["gpu_type"]["id"]))
    expect(page.locator("#id_gpus")).to_have_value(str(wanted.data["cards"]))
    page.screenshot(path=f"{SCREENSHOTS}/instance-create.png", full_page=True)


def test_teams_account_and_a_phone_sized_screen(page, user, outsider, catalog, sim_node, web_server):
    base = f"http://{web_server}"
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, base, "alice", "alice-pass-123")
    page.goto(f"{base}/teams/")
    page.fill("input[name=name]", "Vision Lab")
    page.get_by_role("button", name="Create team").click()
    expect(page.locator(".flash.success")).to_contain_text("Team Vision Lab created")
    page.fill("[data-add-member] input[name=username]", outsider.username)
    page.get_by_role("button", name="Invite", exact=True).click()
    expect(page.locator(".flash.success")).to_contain_text(f"{outsider.username} is invited")
    # The invited user joins from their own teams page; then the admin's page lists them.
    invited = page.context.browser.new_page()
    sign_in(invited, base, outsider.username, "mallory-pass-123")
    invited.goto(f"{base}/teams/")
    expect(invited.locator('[data-invitation="vision-lab"]')).to_contain_text("alice invites you to join Vision Lab")
    invited.screenshot(path=f"{SCREENSHOTS}/team-invitation.png", full_page=True)
    invited.get_by_role("button", name="Join", exact=True).click()
    expect(invited.locator(".flash.success")).to_contain_text("You joined Vision Lab")
    invited.close()
    page.reload()
    expect(page.locator(f'[data-member="{outsider.username}"]')).to_be_visible()
    page.screenshot(path=f"{SCREENSHOTS}/team.png", full_page=True)
    page.goto(f"{base}/instances/new/?team=vision-lab")
    expect(page.locator("#id_team")).to_have_value("vision-lab")
    page.goto(f"{base}/account/")
    page.get_by_role("button", name="Create a token").click()
    expect(page.locator(".flash.success")).to_contain_text("New API token")
    page.screenshot(path=f"{SCREENSHOTS}/account.png", full_page=True)
    page.goto(f"{base}/jobs/")
    expect(page.get_by_role("heading", name="Batch jobs", exact=True)).to_be_visible()
    page.goto(f"{base}/jobs/new/")
    expect(page.locator("input[name=elastic_min]")).to_be_visible()
    expect(page.locator("input[name=elastic_max]")).to_be_visible()
    page.screenshot(path=f"{SCREENSHOTS}/job-create.png", full_page=True)

    # A phone: the navigation and tables fit the width (no page-wide horizontal scroll).
    page.set_viewport_size({"width": 390, "height": 844})
    for path in ("/", "/instances/new/", "/teams/vision-lab/", "/billing/"):
        page.goto(f"{base}{path}")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 390, f"{path} is {width}px wide on a 390px screen"
    page.goto(f"{base}/instances/new/")
    page.screenshot(path=f"{SCREENSHOTS}/phone-create.png", full_page=True)
