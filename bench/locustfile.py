"""Locust users of ``python -m bench load``: researchers of several tenants who submit and
follow runs through the API, researchers and tenant admins who browse the pages after
logging in, and a health probe. A person reading a run page or the run list leaves it open:
the page polls its live parts as the browser does (``LIVE_READS`` polls, each after the
page's own interval), sending the versions it shows (the run page's sections, the run
list's results).

``bench/load.py`` starts Locust with the users' credentials in the JSON file named by
GANTRY_LOAD_USERS (written when it seeds the database), and reads back the request
statistics Locust writes. A request is a failure when its status is not the expected one;
its message names the status, so 5xx answers can be told from the rest.
"""

import itertools
import json
import os
import random
import re
from pathlib import Path

import gevent
from locust import FastHttpUser, between, constant, constant_pacing, task

USERS = json.loads(Path(os.environ["GANTRY_LOAD_USERS"]).read_text())
THINK = between(2, 8)  # seconds between two actions of one person: reading, typing
RUN_LINK = re.compile(r'href="/runs/(\d+)/"')
LIVE_VERSION = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)" data-live-version>')
LIVE_POLL_MS = re.compile(r'hx-get="(/runs/\d+/live/)" hx-trigger="every (\d+)ms"')
LIST_POLL_S = re.compile(r'hx-get="([^"]*partial=rows[^"]*)" hx-trigger="every (\d+)s"')
LIST_VERSION = re.compile(
    r'<input type="hidden" name="shown" value="([^"]*)" data-live-list-version>'
)
LIVE_READS = 2  # polls while a person reads a page they opened (then they think)
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
OLDER_LINK = re.compile(r'href="\?([^"]*before=\d+[^"]*)" rel="next"')
_next = {kind: itertools.count() for kind in USERS}


def credentials(kind: str) -> dict:
    """The next account of ``kind``, round robin: each simulated person has their own."""
    accounts = USERS[kind]
    return accounts[next(_next[kind]) % len(accounts)]


def expect(response, status: int) -> None:
    """Mark the request failed, naming the status, unless it is ``status``."""
    if response.status_code != status:
        kind = "5xx" if response.status_code >= 500 else "unexpected"
        response.failure(f"{kind} HTTP {response.status_code}")
    else:
        response.success()


# Locust starts the users of each second of its spawn rate at one instant (20 at once, a
# second apart); people arriving at that rate come one after the other. Each waits for a
# moment of that second first.
ARRIVAL_SPREAD_S = 1.0


class Person(FastHttpUser):
    abstract = True
    wait_time = THINK

    def on_start(self) -> None:
        self.run_ids: list[int] = []
        self.older: str | None = None
        gevent.sleep(random.uniform(0, ARRIVAL_SPREAD_S))

    def remember(self, ids: list[int]) -> None:
        if ids:
            self.run_ids = ids[:20]

    def some_run(self) -> int | None:
        return random.choice(self.run_ids) if self.run_ids else None

    # --- through the API, with a token ---------------------------------------------------

    def api_start(self) -> None:
        self.account = credentials("api")
        self.headers = {"Authorization": f"Bearer {self.account['token']}"}

    def api_submit(self) -> None:
        body = {
            "tenant": self.account["tenant"],
            "project": self.account["project"],
            "image": self.account["image"],
            "command": "python train.py --epochs 3",
            "flavor": random.choice(self.account["flavors"]),
            "nodes": 1,
            "gpus_per_node": random.choice((1, 1, 2, 2, 4, 8)),
            "name": f"load-{random.randrange(10**6)}",
            # 5 to 20 s of wall time on the benchmark's simulator (60x sped up)
            "env": {"GANTRY_SIM_DURATION_S": str(random.randrange(300, 1200))},
        }
        with self.client.post(
            "/api/v1/runs/", json=body, headers=self.headers, name="API submit run",
            catch_response=True,
        ) as response:  # fmt: skip
            expect(response, 201)
            if response.status_code == 201:
                self.run_ids.insert(0, response.json()["id"])

    def api_list_runs(self) -> None:
        with self.client.get(
            "/api/v1/runs/", headers=self.headers, name="API list runs", catch_response=True
        ) as response:
            expect(response, 200)
            if response.status_code != 200:
                return
            page = response.json()
            self.remember([run["id"] for run in page["results"]])
        if page["next"] and random.random() < 0.3:
            with self.client.get(
                page["next"], headers=self.headers, name="API list runs, older page",
                catch_response=True,
            ) as response:  # fmt: skip
                expect(response, 200)

    def api_run_detail(self) -> None:
        run_id = self.some_run()
        if run_id is None:
            return
        with self.client.get(
            f"/api/v1/runs/{run_id}/", headers=self.headers, name="API run detail",
            catch_response=True,
        ) as response:  # fmt: skip
            expect(response, 200)

    # --- in the portal, logged in ---------------------------------------------------------

    def log_in(self, kind: str) -> None:
        account = credentials(kind)
        with self.client.get(
            "/accounts/login/", name="page: login form", catch_response=True
        ) as response:
            expect(response, 200)
            token = CSRF.search(response.text)
        if token is None:
            return
        with self.client.post(
            "/accounts/login/",
            data={
                "username": account["username"],
                "password": account["password"],
                "csrfmiddlewaretoken": token.group(1),
            },
            name="page: log in (and the home page it leads to)",
            catch_response=True,
        ) as response:
            expect(response, 200)  # the redirect to the home page, followed
            if response.status_code == 200:
                self.remember([int(i) for i in RUN_LINK.findall(response.text)])

    def home(self) -> None:
        with self.client.get("/", name="page: home", catch_response=True) as response:
            expect(response, 200)
            if response.status_code == 200:
                self.remember([int(i) for i in RUN_LINK.findall(response.text)])

    def run_list(self, name: str, query: str = "") -> None:
        with self.client.get(f"/runs/{query}", name=name, catch_response=True) as response:
            expect(response, 200)
            if response.status_code != 200:
                return
            text = response.text
            self.remember([int(i) for i in RUN_LINK.findall(text)])
            older = OLDER_LINK.search(text)
            self.older = older.group(1).replace("&amp;", "&") if older else None
        polled = LIST_POLL_S.search(text)
        shown = LIST_VERSION.search(text)
        for _ in range(LIVE_READS if polled else 0):
            self._sleep(int(polled.group(2)))
            url = "/runs/" + polled.group(1).replace("&amp;", "&")
            params = {"shown": shown.group(1)} if shown else {}
            with self.client.get(
                url, params=params, name="live: run list rows", catch_response=True
            ) as response:
                if response.status_code not in (200, 204):  # 204: the list shows no change
                    expect(response, 200)
                    return
                response.success()
                if response.status_code == 200:
                    shown = LIST_VERSION.search(response.text or "")

    def _sleep(self, seconds: float) -> None:
        gevent.sleep(seconds)  # Locust's users are greenlets

    def runs(self) -> None:
        self.run_list("page: run list")
        if self.older and random.random() < 0.3:
            self.run_list("page: run list, older page", f"?{self.older}")

    def run_page(self) -> None:
        run_id = self.some_run()
        if run_id is None:
            return
        with self.client.get(
            f"/runs/{run_id}/", name="page: run detail", catch_response=True
        ) as response:
            expect(response, 200)
            if response.status_code != 200:
                return
            text = response.text
        polled = LIVE_POLL_MS.search(text)
        versions = dict(LIVE_VERSION.findall(text))
        for _ in range(LIVE_READS if polled else 0):
            self._sleep(int(polled.group(2)) / 1000)
            with self.client.get(
                polled.group(1), params=versions, name="live: run page sections",
                catch_response=True,
            ) as response:  # fmt: skip
                if response.status_code not in (200, 204, 286):
                    expect(response, 200)
                    return
                response.success()
                versions |= dict(LIVE_VERSION.findall(response.text or ""))
                if response.status_code == 286:  # the run ended and the page shows it
                    return

    def quotas(self) -> None:
        with self.client.get("/quotas/", name="page: quotas", catch_response=True) as response:
            expect(response, 200)

    def telemetry(self) -> None:
        run_id = self.some_run()
        if run_id is not None:
            with self.client.get(
                f"/runs/{run_id}/telemetry/", name="page: run telemetry", catch_response=True
            ) as response:
                expect(response, 200)

    def healthz(self) -> None:
        with self.client.get("/healthz", name="healthz", catch_response=True) as response:
            expect(response, 200)


class ApiResearcher(Person):
    """A researcher's scripts: submit experiments, list and follow runs with a token."""

    weight = 40
    tasks = {Person.api_submit: 2, Person.api_list_runs: 3, Person.api_run_detail: 3}

    def on_start(self) -> None:
        super().on_start()
        self.api_start()


class BrowserResearcher(Person):
    """A researcher in the portal: logs in once, then reads pages."""

    weight = 50
    tasks = {
        Person.home: 2,
        Person.runs: 4,
        Person.run_page: 3,
        Person.quotas: 1,
        Person.telemetry: 1,
    }

    def on_start(self) -> None:
        super().on_start()
        self.log_in("browser")
        self.wait()  # reads the home page the log-in led to before the next click


class TenantAdmin(Person):
    """A tenant admin in the portal: quotas first, then the tenant's runs."""

    weight = 10
    tasks = {
        Person.home: 2,
        Person.quotas: 3,
        Person.runs: 3,
        Person.run_page: 2,
        Person.telemetry: 1,
    }

    def on_start(self) -> None:
        super().on_start()
        self.log_in("admin")
        self.wait()  # reads the home page the log-in led to before the next click


class HealthProbe(Person):
    """What a load balancer does: asks whether the process answers, once a second."""

    fixed_count = 2
    wait_time = constant_pacing(1)
    tasks = [Person.healthz]


class SequentialClient(Person):
    """The baseline: one client that does each kind of request in turn, with no pause,
    while nobody else uses the portal."""

    wait_time = constant(0)

    def _sleep(self, seconds: float) -> None:
        pass  # polls right away: what each costs, not how often a page sends it

    def on_start(self) -> None:
        super().on_start()
        self.api_start()
        self.log_in("browser")

    @task
    def each_kind(self) -> None:
        self.api_submit()
        self.api_list_runs()
        self.api_run_detail()
        self.home()
        self.runs()
        self.run_page()
        self.quotas()
        self.telemetry()
        self.healthz()


# The flood: the same people without their pauses (reading, thinking, the pages' poll
# intervals), in the same proportions, so that the portal, not the people, sets how many
# requests a second are served.


def _no_pause(self, seconds: float) -> None:
    pass


class ApiFlood(ApiResearcher):
    wait_time = constant(0)
    _sleep = _no_pause


class BrowserFlood(BrowserResearcher):
    wait_time = constant(0)
    _sleep = _no_pause


class AdminFlood(TenantAdmin):
    wait_time = constant(0)
    _sleep = _no_pause
