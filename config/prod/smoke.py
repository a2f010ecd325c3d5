"""Smoke test of a running production stack, through its TLS proxy only, as a user would.

Signs in through the login page, creates an instance, waits for it to run, opens its terminal
(the WebSocket behind /ws/), stops it and reads its line on the bill. One JSON line per step,
then a summary line; the exit status is 1 if a step failed.

    python config/prod/smoke.py --url https://10.250.0.2 --ca var/prodstack/tls/cert.pem \\
        --user demo --password demo-pass-123

Needs only ``requests`` and ``websockets`` (the dev requirements).
"""

import argparse
import asyncio
import json
import re
import secrets
import ssl
import sys
import time

import requests
import websockets

TERMINAL_PATH = "/ws/terminal/instances/{id}/"


class StepFailed(Exception):
    pass


class Smoke:
    def __init__(self, url: str, ca: str, timeout: float):
        self.url, self.ca, self.timeout = url.rstrip("/"), ca, timeout
        self.http = requests.Session()
        self.http.trust_env = False  # REQUESTS_CA_BUNDLE would override the CA given here
        self.results = []

    # --- HTTP as the browser does it: session cookie, CSRF token, same-origin Referer ---------------
    def request(self, method: str, path: str, expect=(200,), **kwargs) -> requests.Response:
        headers = {"Referer": self.url + "/", "X-CSRFToken": self.http.cookies.get("csrftoken", "")}
        response = self.http.request(
            method, self.url + path, headers=headers | kwargs.pop("headers", {}), verify=self.ca, timeout=30, **kwargs
        )
        if response.status_code not in expect:
            raise StepFailed(f"{method} {path}: HTTP {response.status_code} {response.text[:300]}")
        return response

    def api(self, method: str, path: str, expect=(200,), **kwargs):
        return self.request(method, "/api/v1/" + path, expect=expect, **kwargs).json()

    def wait(self, what: str, probe, timeout: float | None = None):
        deadline = time.monotonic() + (timeout or self.timeout)
        last = None
        while time.monotonic() < deadline:
            ok, last = probe()
            if ok:
                return last
            time.sleep(1)
        raise StepFailed(f"{what}: not within {timeout or self.timeout:.0f} s (last seen: {last})")

    def step(self, name: str, action):
        start = time.monotonic()
        try:
            detail = action()
            result = {"step": name, "ok": True, **(detail or {})}
        except Exception as exc:  # every failure is reported as the step's, and the run goes on where it can
            result = {"step": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        result["seconds"] = round(time.monotonic() - start, 2)
        self.results.append(result)
        print(json.dumps(result), flush=True)
        return result["ok"]

    # --- the steps ----------------------------------------------------------------------------------
    def sign_in(self, user: str, password: str):
        page = self.request("GET", "/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        if not token:
            raise StepFailed("no CSRF token on the login page")
        self.request(
            "POST",
            "/login/",
            expect=(200, 302),
            data={"username": user, "password": password, "csrfmiddlewaretoken": token.group(1)},
            allow_redirects=False,
        )
        me = self.api("GET", "me/")
        if me.get("username") != user:
            raise StepFailed(f"signed in as {me!r}")
        return {
            "user": user,
            "tls": page.url.startswith("https://"),
            "hsts": "Strict-Transport-Security" in page.headers,
        }

    def create(self, gpu_model: str):
        types = self.api("GET", "gpu-types/")
        types = types.get("results", types) if isinstance(types, dict) else types
        gpu_type = next(t for t in types if t["name"] == gpu_model)
        images = self.api("GET", "images/")
        images = images.get("results", images) if isinstance(images, dict) else images
        images = [i for i in images if i.get("status", "ready") == "ready"]  # not those still building
        body = {"image": images[0]["id"], "gpu_type": gpu_type["id"], "gpus": "1", "cpu_cores": 1}
        body |= {"memory_gb": 1, "disk_gb": 5, "name": f"smoke-{secrets.token_hex(3)}"}
        headers = {"Idempotency-Key": secrets.token_hex(16)}
        instance = self.request("POST", "/api/v1/instances/", expect=(201,), json=body, headers=headers).json()
        self.instance = instance
        image = images[0].get("docker_ref") or images[0]["name"]
        return {"instance": instance["id"], "name": instance["name"], "image": image, "gpu": gpu_model}

    def status_is(self, wanted: str):
        def probe():
            instance = self.api("GET", f"instances/{self.instance['id']}/")
            seen = f"{instance['status']} ({instance.get('status_reason', '')})"
            if instance["status"] in ("failed", "released") and wanted != instance["status"]:
                raise StepFailed(seen)
            return instance["status"] == wanted, seen

        return probe

    def running(self):
        seen = self.wait("instance running", self.status_is("running"))
        instance = self.api("GET", f"instances/{self.instance['id']}/")
        return {"status": seen, "node": instance.get("node")}

    def terminal(self, path: str):
        ws_url = self.url.replace("https://", "wss://", 1) + path.format(id=self.instance["id"])
        marker = f"smoke-{secrets.token_hex(4)}"
        context = ssl.create_default_context(cafile=self.ca)
        cookie = "; ".join(f"{c.name}={c.value}" for c in self.http.cookies)

        async def session():
            async with websockets.connect(
                ws_url, ssl=context, additional_headers={"Cookie": cookie, "Origin": self.url}, open_timeout=20
            ) as ws:
                await ws.send(json.dumps({"type": "input", "data": f"echo {marker[:6]}''{marker[6:]}\n"}))
                output = b""
                async with asyncio.timeout(20):
                    while marker.encode() not in output:
                        frame = await ws.recv()
                        output += frame if isinstance(frame, bytes) else frame.encode()
                await ws.send(json.dumps({"type": "input", "data": "exit\n"}))
                return output

        try:
            output = asyncio.run(session())
        except websockets.exceptions.ConnectionClosed as exc:
            code, reason = (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else ("?", "")
            raise StepFailed(f"{ws_url}: closed with {code} {reason}".strip()) from None
        except websockets.exceptions.InvalidStatus as exc:
            raise StepFailed(f"{ws_url}: refused with HTTP {exc.response.status_code}") from None
        return {"echoed": marker, "bytes": len(output)}

    def stop(self):
        self.request("POST", f"/api/v1/instances/{self.instance['id']}/stop/", expect=(200, 202))
        return {"status": self.wait("instance stopped", self.status_is("stopped"))}

    def bill(self):
        def probe():
            lines = self.api("GET", "billing/statement/")
            line = next((line for line in lines if line["name"] == self.instance["name"]), None)
            return bool(line and float(line["seconds"]) > 0 and line["amount"] is not None), line

        line = self.wait("the instance's line on the bill", probe, timeout=90)
        account = self.api("GET", "billing/")
        return {"line": line, "balance": account["balance"], "currency": account["currency"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the proxy, e.g. https://gpu.example.com")
    parser.add_argument("--ca", required=True, help="the CA (or self-signed certificate) to check the proxy with")
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--gpu", default="RTX3090")
    parser.add_argument("--terminal-path", default=TERMINAL_PATH)
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for a status")
    parser.add_argument(
        "--allow-fail", action="append", default=[], metavar="STEP", help="report this step, but do not fail for it"
    )
    args = parser.parse_args()

    smoke = Smoke(args.url, args.ca, args.timeout)
    started = time.monotonic()
    if smoke.step("sign_in", lambda: smoke.sign_in(args.user, args.password)) and smoke.step(
        "create_instance", lambda: smoke.create(args.gpu)
    ):
        if smoke.step("running", smoke.running):
            smoke.step("terminal", lambda: smoke.terminal(args.terminal_path))
        if smoke.step("stop", smoke.stop):
            smoke.step("bill_line", smoke.bill)
    failed = [r["step"] for r in smoke.results if not r["ok"]]
    fatal = [step for step in failed if step not in args.allow_fail]
    steps = ["sign_in", "create_instance", "running", "terminal", "stop", "bill_line"]
    summary = {
        "smoke": "passed" if not fatal else "failed",
        "passed": [r["step"] for r in smoke.results if r["ok"]],
        "failed": failed,
        "not_run": [s for s in steps if s not in {r["step"] for r in smoke.results}],
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary), flush=True)
    return 1 if fatal or summary["not_run"] else 0


if __name__ == "__main__":
    sys.exit(main())
