"""Odd input to every console form never answers 500: huge and negative numbers, unicode, NUL, long strings,
missing fields — one field at a time, the others left as a valid submission would send them.

The API has its own fuzzing (test_api_fuzz.py, from the schema); the console's forms have no schema,
so their fields are listed here, and a console route that takes POST without a row in FORMS fails
``test_every_console_form_is_fuzzed``.
"""

from decimal import Decimal

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from billing import teams
from portal.console.forms import InstanceCreateForm, JobCreateForm
from portal.models import Instance
from tests.portal.test_console import form as console_form
from tests.security.test_authorization_matrix import MATRIX, owned_objects

pytestmark = pytest.mark.django_db

ODD = [
    "",
    " ",
    "-1",
    "0",
    "1.5",
    "-0.0001",
    "99999999999999999999999999999999",
    "1e309",
    "NaN",
    "Infinity",
    "１２",  # full-width digits: int() takes them, the database may not expect it
    "名字 🚀",
    "a\x00b",
    "x" * 5000,
    "../../../etc/passwd",
    "' OR 1=1 --",
    "%(key)s {0} %s",
]


def create_form_fields(form_class, catalog) -> dict:
    """A valid submission of a create form (what the page's defaults send)."""
    instance = console_form(catalog, name="fuzz", team="", idle_util_percent=0, idle_minutes=60)
    if form_class is InstanceCreateForm:
        return instance
    shared = {name: value for name, value in instance.items() if name in JobCreateForm.base_fields}
    return shared | {"command": "true", "priority": 1, "max_runtime_s": "", "env": "A=1", "spot": "", "array": ""}


# route -> (extra URL kwargs, a valid submission: each of its fields gets every ODD value in turn)
def forms(catalog, objects: dict) -> dict:
    member = str(objects["member"])
    return {
        "console-instance-create": ({}, create_form_fields(InstanceCreateForm, catalog)),
        "console-job-create": ({}, create_form_fields(JobCreateForm, catalog)),
        "console-instance-action": ({"action": "stop"}, {"next": "/"}),
        "console-instance-clone": ({}, {}),
        "console-instance-save-image": ({}, {"name": "snapshot"}),
        "console-instance-disk": ({}, {"disk_gb": "20"}),
        "console-instance-file-upload": ({}, {"dir": "/root/autodl-tmp"}),
        "console-image-delete": ({}, {}),
        "console-teams": ({}, {"name": "fuzzers"}),
        "console-team-member-add": ({"action": "add"}, {"username": "mallory"}),
        "console-team-invitation": ({"answer": "decline"}, {}),
        "console-team-member-update": (
            {"action": "update"},
            {"member": member, "is_admin": "on", "monthly_limit": "100"},
        ),
        "console-team-member-remove": ({"action": "remove"}, {"member": member}),
        "console-account-token-create": ({"action": "create"}, {"name": "laptop"}),
        "console-account-token-revoke": ({"action": "revoke"}, {"token": "1"}),
        "console-password": (
            {},
            {"old_password": "alice-pass-123", "new_password1": "n3w-secret-x", "new_password2": "n3w-secret-x"},
        ),
        "console-billing": ({}, {"monthly_budget": "300"}),
        "console-job-action": ({"action": "cancel"}, {"next": "/jobs/"}),
        "console-array-action": ({"action": "cancel"}, {"next": "/jobs/"}),
        "set_language": ({}, {"language": "zh-hans", "next": "/"}),
        "login": ({}, {"username": "alice", "password": "alice-pass-123"}),
    }


# The pages' query parameters (reports' filters, a statement's month, the files page's path).
QUERIES = {
    "console-billing": ["month"],
    "console-billing-statement-csv": ["month"],
    "console-billing-reports": ["start", "end", "gpu_model", "team", "export"],
    "console-instance-files": ["path"],
    "console-instance-file-download": ["path"],
    "console-instance-create": ["image", "team"],
    "console-job-create": ["image", "team"],
    "console-instances": ["page"],
    "console-jobs": ["page"],
}
ROUTE_OF = {  # rows of FORMS that are one route with several actions
    "console-team-member-add": "console-team-member",
    "console-team-member-update": "console-team-member",
    "console-team-member-remove": "console-team-member",
    "console-account-token-create": "console-account-token",
    "console-account-token-revoke": "console-account-token",
}
FORM_ROUTES = [
    "console-instance-create", "console-job-create", "console-instance-action", "console-instance-clone",
    "console-instance-save-image", "console-instance-disk", "console-instance-file-upload", "console-image-delete",
    "console-teams", "console-team-member-add", "console-team-member-update", "console-team-member-remove",
    "console-account-token-create", "console-account-token-revoke", "console-password", "console-billing",
    "console-job-action", "console-array-action", "set_language", "login", "console-team-invitation",
]  # fmt: skip


def test_every_console_form_is_fuzzed():
    posted = {route for route, (method, *_) in MATRIX.items() if method == "post" and not route.startswith("api-")}
    posted |= {"console-instance-create", "console-job-create", "console-teams", "console-billing", "login"}
    posted |= {"console-password"}  # pages whose GET the matrix checks, and whose form posts back to them
    posted -= {"logout"}  # no fields
    assert posted == {ROUTE_OF.get(row, row) for row in FORM_ROUTES}


@pytest.fixture
def signed_in(user, outsider, catalog, sim_node):
    objects = owned_objects(user, catalog)
    team = teams.team_get(user=user, slug=objects["slug"])
    objects["member"] = teams.member_add(team=team, by=user, username=outsider.username).pk
    client = Client(raise_request_exception=False)  # a 500 is an answer the test reads, with what was sent
    client.force_login(user)
    return client, objects


def url_of(route: str, objects: dict, extra: dict) -> str:
    from tests.security.test_authorization_matrix import url_for

    return url_for(ROUTE_OF.get(route, route), objects, extra)


def answers(client: Client, method: str, url: str, data: dict):
    response = getattr(client, method)(url, data)
    assert response.status_code < 500, f"{method.upper()} {url} {data!r:.300} -> {response.status_code}"
    return response


@pytest.mark.parametrize("route", FORM_ROUTES)
def test_odd_values_in_any_field_of_a_console_form_never_answer_500(route, signed_in, catalog, user):
    client, objects = signed_in
    extra, valid = forms(catalog, objects)[route]
    url = url_of(route, objects, extra)
    upload = route == "console-instance-file-upload"
    answers(client, "post", url, {})  # every field missing
    for field in valid:
        for value in ODD:
            data = valid | {field: value}
            if upload:
                data["file"] = SimpleUploadedFile("x.txt", b"x")
            answers(client, "post", url, data)
            if route in ("console-password", "login"):
                client.force_login(user)  # a changed password or a failed sign-in signs this client out
                user.set_password("alice-pass-123")
                user.save()
    for value in ODD[:4]:  # a field the form does not have is ignored, not a crash
        answers(client, "post", url, valid | {"unexpected": value})


@pytest.mark.parametrize("route", sorted(QUERIES))
def test_odd_query_parameters_on_console_pages_never_answer_500(route, signed_in, django_user_model):
    client, objects = signed_in
    if route == "console-billing-reports":
        client.force_login(django_user_model.objects.create_user("ops", is_staff=True, is_superuser=True))
    url = url_of(route, objects, {})
    for name in QUERIES[route]:
        for value in ODD:
            answers(client, "get", url, {name: value})


def test_a_console_form_with_a_huge_number_of_cards_is_refused_at_the_field(signed_in, catalog):
    client, _ = signed_in
    data = create_form_fields(InstanceCreateForm, catalog) | {"gpus": "1e9"}
    response = answers(client, "post", reverse("console-instance-create"), data)
    assert response.status_code == 200 and response.context["form"].errors["gpus"]
    assert not Instance.objects.filter(name="fuzz", gpus=Decimal("1e9")).exists()


def test_a_nul_in_a_query_is_a_400_naming_the_field_as_json_for_the_api_and_text_for_pages(api, signed_in):
    refused = api.get("/api/v1/instances/", {"name": "a\x00b"})
    assert refused.status_code == 400 and refused.json()["name"] == ["a NUL character is not allowed"]
    client, _ = signed_in
    page = client.get("/billing/", {"month": "2026\x0011"})
    assert page.status_code == 400 and page.content.decode() == "month: a NUL character is not allowed"
