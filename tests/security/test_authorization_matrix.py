"""Who may use which route: every REST, console and WebSocket route x every method x {owner, other user,
anonymous, superuser staff, plain staff, support, an operator, the owner's teammate}; every socket from a
foreign Origin.

The routes are read from the URL conf and the WebSocket routing, so a route added
without a row in MATRIX fails ``test_every_route_is_in_the_matrix``. A method a row
does not name must be refused (405, or the refusal the role gets anyway) and change nothing.
"""

import asyncio
import re
from decimal import Decimal

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLResolver, get_resolver, reverse

from billing import teams
from billing.models import TeamInvitation
from config.asgi import application
from portal.models import Image
from portal.services import arrays, work
from portal.services.requests import ArrayRequest, InstanceRequest, JobRequest
from portal.sockets.routing import websocket_urlpatterns
from scheduler.models import Node
from tests.conftest import staff_member

ALLOWED, HIDDEN, DENIED, NOT_ALLOWED, THROTTLED = "allowed", "404", "denied", "405", "429"
ROLES = ("owner", "other", "anonymous", "staff")  # the columns of MATRIX; "staff" is a superuser
# Plain staff (is_staff, no permissions) and a member of the owner's team: by default as "staff" and
# "other" in each row, but for these (route -> outcome).
STAFFER = {
    "api-billing-topups": DENIED,  # making money needs billing.top_up, not just is_staff
    "api-billing-topup-approve": DENIED,
    "admin:index": ALLOWED,  # the admin's front page, saying there is nothing this account may change
    "admin:password_change": ALLOWED,
    "admin:password_change_done": ALLOWED,
    "admin:jsi18n": ALLOWED,
    "admin:view_on_site": HIDDEN,
    "admin:autocomplete": DENIED,
    "admin:None": HIDDEN,
    "admin:app_list": HIDDEN,  # an app it may see nothing of
    "admin:login": ALLOWED,  # signed in already: sent on to the index
}
# Django answers the history page of an object that does not exist with a redirect to the index, before
# it checks permissions (staff only, and it tells nothing); the matrix makes objects of these models only.
MADE = (
    "auth_user", "auth_group", "billing_team", "portal_image", "portal_instance", "portal_job", "scheduler_workload"
)  # fmt: skip
# Powers over other people's work are permissions (core.powers), not being staff:
# plain staff see none of it; support (the "Support" group) see it and may not act on it (403); operators
# ("Operators") do both. Cloning is its owner's only (a clone is made from the instance's, maybe private, image).
WORK_VIEWS = {
    "console-instance", "console-instance-monitor", "console-job", "console-array", "api-instance", "api-job",
    "api-array", "ws/monitor/instances/<int:instance_id>/",
}  # fmt: skip
WORK_ACTIONS = {
    "console-instance-action", "console-instance-save-image", "console-instance-disk", "console-job-action",
    "console-array-action", "api-instance-save-image", "api-instance-disk", "api-instance-start",
    "api-instance-start-no-gpu", "api-instance-stop", "api-instance-restart", "api-instance-release",
    "api-instance-move", "api-job-cancel", "api-job-release", "api-array-cancel", "api-array-retry",
}  # fmt: skip
STAFFER |= dict.fromkeys(WORK_VIEWS | WORK_ACTIONS, HIDDEN)
# Teams likewise: seeing any team and running it as its admins would are billing.view_team / change_team
# (the "Billing" group's), not being staff.
STAFFER |= {"console-team": HIDDEN, "console-team-member": HIDDEN}
SUPPORT = dict.fromkeys(WORK_VIEWS, ALLOWED) | dict.fromkeys(WORK_ACTIONS, DENIED)
OPERATOR = dict.fromkeys(WORK_VIEWS | WORK_ACTIONS, ALLOWED)
TEAMMATE = {
    "console-team": ALLOWED,  # members see their team
    "console-team-member": ALLOWED,  # and are told only admins change it (a message, no change)
}
METHODS = ("get", "post", "put", "patch", "delete")
# Routes that answer a second method too (a page and the form it posts back to), for the same people.
ALSO = {
    "console-instance-create": {"post"},
    "console-job-create": {"post"},
    "console-teams": {"post"},
    "console-billing": {"post"},
    "console-password": {"post"},
    "login": {"post"},
    "admin:login": {"post"},
    "api-billing": {"patch"},
    "api-instances": {"post"},
    "api-jobs": {"post"},
    "api-arrays": {"post"},
    "api-image": {"delete"},
    "api-instance-file-upload": {"put"},
    "api-job-file-upload": {"put"},
    # Django's view: changes the language on POST; any other method is a redirect that changes nothing.
    "set_language": {"get", "put", "patch", "delete"},
}
MINE = (ALLOWED, ALLOWED, DENIED, ALLOWED)  # a list or form: everyone signed in sees their own
OWNED = (ALLOWED, HIDDEN, DENIED, ALLOWED)  # one object: its owner and staff; others get 404
STAFF_ONLY = (DENIED, DENIED, DENIED, ALLOWED)
OPEN = (ALLOWED, ALLOWED, ALLOWED, ALLOWED)
SIGNED_OUT = "signed out"
SIGNS_OUT = (SIGNED_OUT,) * 4  # sign-out answers everyone alike: now you are signed out

# route name -> (method, extra URL kwargs, query string, expected outcome per role in ROLES order)
MATRIX = {
    "console-instances": ("get", {}, "", MINE),
    "console-instance-create": ("get", {}, "", MINE),
    "console-instance-action": ("post", {"action": "stop"}, "", OWNED),
    "console-instance": ("get", {}, "", OWNED),
    "console-instance-monitor": ("get", {}, "", OWNED),
    "console-instance-clone": ("post", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    # Files: the owner only; the matrix's instance is queued, so the owner gets the page saying so (or a redirect).
    "console-instance-files": ("get", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "console-instance-file-download": ("get", {}, "?path=/root/autodl-tmp/x", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "console-instance-file-upload": ("post", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "console-instance-logs": ("get", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),  # a log: its owner's only
    "console-instance-save-image": ("post", {}, "", OWNED),  # the queued instance: refused with a message
    "console-images": ("get", {}, "", MINE),
    "console-instance-disk": ("post", {}, "", OWNED),  # an empty size: refused with a message
    "set_language": ("post", {}, "", OPEN),
    "javascript-catalog": (
        "get",
        {},
        "",
        OPEN,
    ),  # the live pages' translated strings  # a cookie for whoever asks, signed in or not
    "console-image-delete": ("post", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),  # saved images: the owner only
    "console-teams": ("get", {}, "", MINE),
    # The owner's team: members see it; others get 404; staff see every team.
    "console-team": ("get", {}, "", OWNED),
    "console-team-member": ("post", {"action": "add"}, "", OWNED),  # refused with a message: no username
    # An invitation to join a team: its invited user answers it; anyone else, staff too, gets 404.
    "console-team-invitation": ("post", {"answer": "decline"}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "console-account": ("get", {}, "", MINE),
    "console-account-token": ("post", {"action": "create"}, "", MINE),
    "console-password": ("get", {}, "", MINE),
    "console-instance-terminal": ("get", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),  # the owner only
    "console-cluster": ("get", {}, "", STAFF_ONLY),
    "console-jobs": ("get", {}, "", MINE),
    "console-job-create": ("get", {}, "", MINE),
    "console-job": ("get", {}, "", OWNED),
    "console-job-action": ("post", {"action": "cancel"}, "", OWNED),
    "console-array": ("get", {}, "", OWNED),
    "console-array-action": ("post", {"action": "cancel"}, "", OWNED),
    "healthz": ("get", {}, "", OPEN),
    "metrics": ("get", {}, "", STAFF_ONLY),  # or a bearer token: tests/monitoring/test_metrics.py
    # The registry's token server: basic credentials only, never a session (token mode is off here: 404 to all;
    # with it on, a session gets 401): tests/portal/test_registry_tokens.py.
    "registry-token": ("get", {}, "", (HIDDEN, HIDDEN, HIDDEN, HIDDEN)),
    "login": ("get", {}, "", OPEN),
    "logout": ("post", {}, "", SIGNS_OUT),
    "api-me": ("get", {}, "", MINE),
    # Credentials in the body: anyone may try (the empty body: 400); throttled per address and username.
    "api-auth-token": ("post", {}, "", OPEN),
    # Files of a running instance or job: the owner only (the matrix's work is queued: 409, still allowed).
    "api-instance-files": ("get", {}, "?path=/root/autodl-tmp", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "api-instance-file-download": ("get", {}, "?path=/root/autodl-tmp/x", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "api-instance-file-upload": ("post", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "api-job-files": ("get", {}, "?path=/root/checkpoints", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "api-job-logs": ("get", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),  # the queued job's (empty) log
    "api-instance-logs": ("get", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "api-job-file-download": ("get", {}, "?path=/root/checkpoints/x", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "api-job-file-upload": ("post", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "api-gpu-types": ("get", {}, "", MINE),
    "api-gpu-types-recommend": ("get", {}, "?model_params_b=7", MINE),
    "api-images": ("get", {}, "", MINE),
    "api-image": ("get", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "api-instance-save-image": ("post", {}, "", OWNED),
    "api-instance-disk": ("post", {}, "", OWNED),
    "api-instances": ("get", {}, "", MINE),
    "api-instance": ("get", {}, "", OWNED),
    "api-instance-start": ("post", {}, "", OWNED),
    "api-instance-start-no-gpu": ("post", {}, "", OWNED),  # the queued instance: 409, still "allowed"
    "api-instance-stop": ("post", {}, "", OWNED),
    "api-instance-restart": ("post", {}, "", OWNED),
    "api-instance-release": ("post", {}, "", OWNED),
    "api-instance-move": ("post", {}, "", OWNED),  # the queued instance: 409, still "allowed"
    "api-nodes": ("get", {}, "", STAFF_ONLY),
    "api-instance-clone": ("post", {}, "", (ALLOWED, HIDDEN, DENIED, HIDDEN)),
    "api-jobs": ("get", {}, "", MINE),
    "api-job": ("get", {}, "", OWNED),
    "api-job-cancel": ("post", {}, "", OWNED),
    "api-job-release": ("post", {}, "", OWNED),
    "api-arrays": ("get", {}, "", MINE),
    "api-array": ("get", {}, "", OWNED),
    "api-array-cancel": ("post", {}, "", OWNED),
    "api-array-retry": ("post", {}, "", OWNED),  # nothing failed yet: 409, still "allowed"
    "api-billing": ("get", {}, "", MINE),
    "api-billing-statement": ("get", {}, "", MINE),
    "api-billing-topups": ("post", {}, "", STAFF_ONLY),  # staff: 400 for the empty body
    "api-billing-topup-approve": ("post", {}, "", (DENIED, DENIED, DENIED, HIDDEN)),  # no such request: 404
    "api-prices": ("get", {}, "?gpu_type=1&gpus=0.5", MINE),
    "console-billing": ("get", {}, "", MINE),
    "console-billing-statement-csv": ("get", {}, "", MINE),
    "console-billing-reports": ("get", {}, "", STAFF_ONLY),
    "api-schema": ("get", {}, "", MINE),
    "api-docs": ("get", {}, "", MINE),
}
# WebSocket route -> expected outcome per role; refusals close with 4401 (anonymous), 4403 (not staff), 4404 (hidden)
WEBSOCKET_MATRIX = {
    "ws/instances/": MINE,
    "ws/monitor/instances/<int:instance_id>/": OWNED,
    "ws/monitor/nodes/<slug:node>/": STAFF_ONLY,
    "ws/monitor/cluster/": STAFF_ONLY,
    # The owner only (a shell in their container); the matrix's instance is queued: 4409 "not running".
    "ws/terminal/instances/<int:instance_id>/": (ALLOWED, HIDDEN, DENIED, HIDDEN),
    "ws/terminal/jobs/<int:job_id>/": (ALLOWED, HIDDEN, DENIED, HIDDEN),  # the same, in a running job
    "ws/logs/jobs/<int:job_id>/": (ALLOWED, HIDDEN, DENIED, HIDDEN),  # followed: open while the job waits
    "ws/logs/instances/<int:instance_id>/": (ALLOWED, HIDDEN, DENIED, HIDDEN),
}
CLOSE_CODES = {4401: DENIED, 4403: DENIED, 4404: HIDDEN, 4409: ALLOWED}  # 4409: allowed, but not running
# Django's admin: every page is for staff, but for these.
ADMIN_EXPECTED = {
    "admin:login": OPEN,
    "admin:logout": SIGNS_OUT,
    # Staff only; it answers 403 to anything but a configured autocomplete field (we configure none).
    "admin:autocomplete": (DENIED, DENIED, DENIED, DENIED),
    # Staff reach it; our objects have no public page to send them to.
    "admin:view_on_site": (DENIED, DENIED, DENIED, HIDDEN),
    # Money: wallets come with their users and teams and are never deleted; the ledger is append-only
    # (postings come from settlement and top-ups, never from a form); rates in force are never deleted;
    # spot prices come from the cluster's load.
    "admin:billing_account_add": (DENIED, DENIED, DENIED, DENIED),
    "admin:billing_account_delete": (DENIED, DENIED, DENIED, DENIED),
    "admin:billing_posting_add": (DENIED, DENIED, DENIED, DENIED),
    "admin:billing_posting_delete": (DENIED, DENIED, DENIED, DENIED),
    "admin:billing_ratecard_delete": (DENIED, DENIED, DENIED, DENIED),
    "admin:billing_spotprice_add": (DENIED, DENIED, DENIED, DENIED),
    # A top-up waiting for approval comes from a top-up, and goes only by being approved (an action).
    "admin:billing_topuprequest_add": (DENIED, DENIED, DENIED, DENIED),
    "admin:billing_topuprequest_delete": (DENIED, DENIED, DENIED, DENIED),
    # The audit of powers used over others' work is written by the services that used them, never by hand.
    "admin:portal_auditentry_add": (DENIED, DENIED, DENIED, DENIED),
    "admin:portal_auditentry_delete": (DENIED, DENIED, DENIED, DENIED),
    # Minute rollups are written by node agents only: nobody adds one by hand.
    "admin:scheduler_gpuminute_add": (DENIED, DENIED, DENIED, DENIED),
    "admin:scheduler_workloadgpuminute_add": (DENIED, DENIED, DENIED, DENIED),
    # The catch-all for unknown admin pages: staff get a 404, others the sign-in page.
    "admin:None": (DENIED, DENIED, DENIED, HIDDEN),
}


def url_routes():
    def walk(patterns, namespace=None):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, pattern.namespace or namespace)
            else:
                yield (f"{namespace}:{pattern.name}" if namespace else pattern.name), pattern

    return dict(walk(get_resolver().url_patterns))


ROUTES = url_routes()
ADMIN_ROUTES = sorted(name for name in ROUTES if name.startswith("admin:"))


def test_every_route_is_in_the_matrix():
    plain = {name for name in ROUTES if not name.startswith("admin:")}
    assert plain == set(MATRIX), "add the new route to MATRIX with who may use it (or drop a stale row)"
    assert {str(p.pattern) for p in websocket_urlpatterns} == set(WEBSOCKET_MATRIX)


@pytest.fixture
def people(django_user_model, user, outsider):
    staff = django_user_model.objects.create_user("root", password="root-pass-123", is_staff=True, is_superuser=True)
    staffer = django_user_model.objects.create_user("clerk", password="clerk-pass-123", is_staff=True)
    teammate = django_user_model.objects.create_user("tess", password="tess-pass-123")
    support, operator = (
        staff_member(django_user_model, "sue", "Support"),
        staff_member(django_user_model, "otto", "Operators"),
    )
    return {
        "owner": user, "other": outsider, "anonymous": None, "staff": staff, "staffer": staffer, "teammate": teammate,
        "support": support, "operator": operator,
    }  # fmt: skip


def expected_for(route: str, row: tuple) -> dict:
    """MATRIX's four columns, and the plain staff's and the teammate's outcome."""
    expected = dict(zip(ROLES, row, strict=True))
    staffer = DENIED if route.startswith("admin:") and expected["staff"] == ALLOWED else expected["staff"]
    if route.endswith("_history") and route.removeprefix("admin:").removesuffix("_history") not in MADE:
        staffer = ALLOWED
    staffer = STAFFER.get(route, staffer)  # the admin's pages need model permissions it has not
    return expected | {
        "staffer": staffer,
        "support": SUPPORT.get(route, staffer),
        "operator": OPERATOR.get(route, staffer),
        "teammate": TEAMMATE.get(route, expected["other"]),
    }


def client_for(person) -> Client:
    client = Client()
    if person is not None:
        client.force_login(person)
    return client


def owned_objects(owner, catalog) -> dict:
    common = dict(owner=owner, name="x", image_id=catalog["image"].pk, gpu_type_id=catalog["rtx3090"].pk)
    common |= dict(gpus=Decimal("0.5"), cpu_cores=1, memory_gb=1)
    instance = work.instance_create(InstanceRequest(**common, disk_gb=10))
    job = work.job_create(JobRequest(**common, command="true"))
    array = arrays.array_create(ArrayRequest(**common, command="true", array="0-1"))
    image = Image.objects.create(
        name="saved", framework="x", framework_version="1", cuda_version="12", docker_ref="gpucloud-saved:x",
        visibility="private", owner=owner, node=Node.objects.first(),
    )  # fmt: skip
    team = teams.team_create(user=owner, name=f"team {image.pk}")
    teammate = type(owner).objects.filter(username="tess").first()
    if teammate is not None:
        teams.member_add(team=teams.team_get(user=owner, slug=team.slug), by=owner, username=teammate.username)
    inviter = type(owner).objects.filter(username="ivy").first() or type(owner).objects.create_user("ivy")
    elsewhere = teams.team_create(user=inviter, name=f"invites {image.pk}")
    teams.member_invite(team=teams.team_get(user=inviter, slug=elsewhere.slug), by=inviter, username=owner.username)
    return {
        "invitation_id": TeamInvitation.objects.get(team=elsewhere, user=owner).pk,
        "slug": team.slug,
        "billing_team": team.pk,
        "image_id": image.pk,
        "portal_image": image.pk,
        "instance_id": instance.pk,
        "job_id": job.pk,
        "array_id": array.pk,
        "portal_instance": instance.pk,
        "portal_job": job.pk,
        "scheduler_workload": instance.workload_id,
        "auth_user": owner.pk,
        "auth_group": Group.objects.get(name="Support").pk,
    }


def outcome(response, route: str) -> str:
    if route in ("logout", "admin:logout") and response.status_code in (200, 302):
        return SIGNED_OUT
    if response.status_code == 405:
        return NOT_ALLOWED
    if response.status_code == 429:
        return THROTTLED  # sign-in attempts: the limit counts every method
    location = response.get("Location", "")
    if response.status_code in (401, 403) or (response.status_code == 302 and "login/" in location):
        return DENIED
    if response.status_code == 404:
        return HIDDEN
    assert response.status_code < 500, response.content[:500]
    return ALLOWED


def url_for(route: str, objects: dict, extra: dict) -> str:
    if route == "admin:None":
        return "/admin/no-such-page/"
    names = ROUTES[route].pattern.regex.groupindex.keys()
    kwargs = {name: objects[name] for name in names if name in objects} | extra
    for name in {"object_id", "id"} & set(names):  # the admin's pages of one real object
        page = route.removeprefix("admin:")
        kwargs[name] = next((pk for model, pk in objects.items() if page.startswith(f"{model}_")), 1)
    if "app_label" in names:
        kwargs["app_label"] = "portal"
    kwargs |= {name: 1 for name in names if name not in kwargs}
    return reverse(route, kwargs=kwargs)


def state(objects: dict) -> tuple:
    """What a refused request must leave as it was: the matrix's work, image and team."""
    from billing.models import Membership
    from scheduler.models import Workload

    return (
        sorted(Workload.objects.values_list("id", "status")),
        sorted(Image.objects.values_list("id", "name", "status")),
        sorted(Membership.objects.values_list("id", "is_admin", "monthly_limit")),
    )


@pytest.mark.django_db
@pytest.mark.parametrize("route", sorted(MATRIX))
def test_route_allows_exactly_whom_it_should(route, people, catalog, sim_node, settings):
    settings.MAX_QUEUED_PER_USER = 1000  # the owner's work, made afresh for every role and method, stays queued
    method, extra, query, row = MATRIX[route]
    seen, expected = {}, expected_for(route, row)
    for role in people:
        for answered in {method} | ALSO.get(route, set()):
            objects = owned_objects(people["owner"], catalog)  # fresh per role: an action changes state
            url = url_for(route, objects, extra) + query
            seen[role, answered] = outcome(getattr(client_for(people[role]), answered)(url), route)
    assert seen == {(role, answered): expected[role] for role, answered in seen}


@pytest.mark.django_db
@pytest.mark.parametrize("route", sorted(MATRIX))
def test_every_other_method_is_refused_and_changes_nothing(route, people, catalog, sim_node):
    method, extra, query, row = MATRIX[route]
    objects = owned_objects(people["owner"], catalog)
    url, before = url_for(route, objects, extra) + query, state(objects)
    refused = {NOT_ALLOWED, DENIED, HIDDEN, THROTTLED}
    seen = {}
    for role in people:
        for other in set(METHODS) - {method} - ALSO.get(route, set()):
            answer = outcome(getattr(client_for(people[role]), other)(url), route)
            if answer not in refused and not (route == "logout" and answer == SIGNED_OUT):
                seen[role, other] = answer
    assert seen == {}, "methods a route does not take must be refused"
    assert state(objects) == before


@pytest.mark.django_db
@pytest.mark.parametrize("route", ADMIN_ROUTES)
def test_admin_pages_are_for_staff_only(route, people, catalog, sim_node):
    url = url_for(route, owned_objects(people["owner"], catalog), {})
    method = "post" if route == "admin:logout" else "get"
    seen = {role: outcome(getattr(client_for(people[role]), method)(url), route) for role in people}
    assert seen == expected_for(route, ADMIN_EXPECTED.get(route, STAFF_ONLY))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", sorted(WEBSOCKET_MATRIX))
def test_websocket_route_accepts_exactly_whom_it_should(route, people, catalog, sim_node):
    objects = owned_objects(people["owner"], catalog) | {"node": sim_node.name}
    path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(objects[m[1]]), route)

    async def connects(cookie: str | None) -> str:
        headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
        if cookie is not None:
            headers.append((b"cookie", f"sessionid={cookie}".encode()))
        communicator = WebsocketCommunicator(application, f"/{path}", headers=headers)
        connected, _ = await communicator.connect(timeout=10)
        assert connected, "refusals are a close code after the handshake, which a browser can read"
        if await communicator.receive_nothing(timeout=1):
            await communicator.disconnect()
            return ALLOWED  # open, and quiet until something happens
        first = await communicator.receive_output(timeout=10)
        await communicator.disconnect()
        return CLOSE_CODES[first["code"]] if first["type"] == "websocket.close" else ALLOWED

    cookies = {role: p and client_for(p).cookies["sessionid"].value for role, p in people.items()}
    seen = {role: asyncio.run(connects(cookies[role])) for role in people}
    assert seen == expected_for(route, WEBSOCKET_MATRIX[route])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", sorted(WEBSOCKET_MATRIX))
def test_no_websocket_opens_for_a_page_on_another_site(route, people, catalog, sim_node):
    """A page elsewhere opening a socket with the signed-in user's cookie: refused at the handshake, for everyone."""
    objects = owned_objects(people["owner"], catalog) | {"node": sim_node.name}
    path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(objects[m[1]]), route)

    async def opens(cookie: str, origin: bytes) -> bool:
        headers = [(b"origin", origin), (b"host", b"127.0.0.1"), (b"cookie", f"sessionid={cookie}".encode())]
        communicator = WebsocketCommunicator(application, f"/{path}", headers=headers)
        connected, _ = await communicator.connect(timeout=10)
        if connected:
            await communicator.disconnect()
        return connected

    for role in ("owner", "staff"):
        cookie = client_for(people[role]).cookies["sessionid"].value
        for origin in (b"http://evil.example", b"null", b"http://127.0.0.1.evil.example"):
            assert not asyncio.run(opens(cookie, origin)), f"{role} from {origin.decode()}"
        assert asyncio.run(opens(cookie, b"http://127.0.0.1")), "the same page's origin opens it"
