"""Structure of the distributed deployment (no container engine runs in the test environment)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LANES = ("visual", "agent", "embedding")
APP_SERVICES = ("migrate", "api", *(f"worker-{lane}" for lane in LANES), "worker-webhooks", "worker-maintenance",
                "beat", "flower")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def test_all_services_present(services):
    assert set(services) == {"postgres", "redis", *APP_SERVICES}


def test_postgres_is_pgvector_with_volume_and_healthcheck(services):
    pg = services["postgres"]
    assert re.fullmatch(r"pgvector/pgvector:pg1[6-9]", pg["image"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert pg["environment"]["POSTGRES_DB"] == "memeflow"


def test_redis_persists_and_has_healthcheck(services):
    redis = services["redis"]
    assert redis["image"].startswith("redis:")
    assert "--appendonly" in redis["command"]
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert redis["healthcheck"]["test"][-1] == "ping"


@pytest.mark.parametrize(
    ("service", "command"),
    [
        ("migrate", ["memeflow", "db", "upgrade"]),
        *((f"worker-{lane}", ["memeflow", "worker", "--lane", lane]) for lane in LANES),
        ("worker-webhooks", ["memeflow", "worker", "--lane", "webhooks"]),
        ("worker-maintenance", ["memeflow", "worker", "--lane", "maintenance"]),
        ("beat", ["memeflow", "beat"]),
        ("flower", ["memeflow", "flower", "--address", "0.0.0.0"]),
    ],
)
def test_commands(services, service, command):
    assert services[service]["command"] == command


def test_api_runs_gunicorn_on_the_wsgi_app(services):
    cmd = services["api"]["command"]
    assert cmd[0] == "gunicorn" and "app.api.wsgi:app" in cmd
    assert any(arg.startswith("--bind=0.0.0.0:5000") for arg in cmd)
    assert "--worker-class=app.api.server.JsonErrorWorker" in cmd  # gunicorn's own errors are JSON too
    assert "/healthz" in " ".join(services["api"]["healthcheck"]["test"])
    assert any(p.endswith(":5000") for p in services["api"]["ports"])


@pytest.mark.parametrize("service", APP_SERVICES)
def test_app_services_point_at_postgres_and_redis(services, service):
    env = services[service]["environment"]
    assert "@postgres:5432/memeflow" in env["MEMEFLOW_DATABASE_URL"]
    assert env["MEMEFLOW_DATABASE_URL"].startswith("postgresql")
    assert env["MEMEFLOW_BROKER_URL"] == "redis://redis:6379/0"
    assert services[service]["build"] == "."


@pytest.mark.parametrize("service", [s for s in APP_SERVICES if s != "migrate"])
def test_long_running_services_wait_for_migration_and_have_healthchecks(services, service):
    svc = services[service]
    deps = svc["depends_on"]
    assert deps["migrate"]["condition"] == "service_completed_successfully"
    assert deps["postgres"]["condition"] == "service_healthy"
    assert deps["redis"]["condition"] == "service_healthy"
    assert svc["healthcheck"]["test"], f"{service} needs a healthcheck"
    assert svc["restart"] == "unless-stopped"


def test_migrate_is_one_shot_after_healthy_postgres(services):
    migrate = services["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("lane", LANES)
def test_workers_are_scalable_and_share_storage(services, lane):
    worker = services[f"worker-{lane}"]
    # --scale needs no fixed container name and no published host port
    assert "container_name" not in worker and "ports" not in worker
    assert "storage:/data/storage" in worker["volumes"]
    assert worker["environment"]["MEMEFLOW_STORAGE_DIR"] == "/data/storage"
    assert "inspect ping" in " ".join(worker["healthcheck"]["test"])


def test_api_shares_storage_with_workers(services):
    assert "storage:/data/storage" in services["api"]["volumes"]


def test_flower_requires_basic_auth_from_env(services):
    env = services["flower"]["environment"]
    assert env["MEMEFLOW_FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")
    check = " ".join(services["flower"]["healthcheck"]["test"])
    # the healthcheck sends the credentials through curl's config on stdin, never as an argument
    assert "-K -" in check and "$$MEMEFLOW_FLOWER_BASIC_AUTH" in check and " -u " not in check
    assert not any("basic_auth" in arg.lower() for arg in services["flower"]["command"])


def _expand(value: str) -> str:
    """Compose's ${VAR:-default} with every variable unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


@pytest.mark.parametrize(("service", "container_port", "env_prefix"), [("api", 5000, "API"), ("flower", 5555, "FLOWER")])
def test_published_ports_are_explicit_and_loopback_by_default(services, service, container_port, env_prefix):
    (port,) = services[service]["ports"]
    assert port == f"${{{env_prefix}_BIND:-127.0.0.1}}:${{{env_prefix}_PORT:-{container_port}}}:{container_port}"
    assert _expand(port) == f"127.0.0.1:{container_port}:{container_port}"


def test_nothing_else_publishes_a_port(services):
    assert {name for name, svc in services.items() if "ports" in svc} == {"api", "flower"}


def test_published_ports_are_documented():
    header = (ROOT / "docker-compose.yml").read_text().split("\nname:")[0]
    doc = (ROOT / "docs" / "security.md").read_text()
    for needle in ("API_BIND", "API_PORT", "FLOWER_BIND", "FLOWER_PORT"):
        assert needle in header and needle in doc, needle


def test_api_gunicorn_resists_slow_clients_and_parses(services):
    """The compose command is valid gunicorn: threaded workers, timeouts and request limits."""
    from gunicorn.config import Config

    args = [_expand(a) for a in services["api"]["command"][1:]]
    cfg = Config()
    parsed = cfg.parser().parse_args(args)
    for name, value in vars(parsed).items():
        if value is not None and name in cfg.settings:
            cfg.set(name, value)
    assert parsed.args == ["app.api.wsgi:app"]
    assert "--config=python:app.api.gunicorn_conf" in args
    from gunicorn.workers.gthread import ThreadWorker

    # gthread, with gunicorn's own error responses in JSON (app/api/server.py)
    assert cfg.worker_class_str == "app.api.server.JsonErrorWorker" and cfg.threads >= 8
    assert issubclass(cfg.worker_class, ThreadWorker)
    assert cfg.timeout <= 120 and cfg.graceful_timeout <= 30 and 0 < cfg.keepalive <= 10
    assert cfg.limit_request_line <= 8190 and cfg.limit_request_fields <= 100


def test_api_environment_carries_the_safe_defaults(services):
    env = services["api"]["environment"]
    assert env["MEMEFLOW_AUTH"] == "${MEMEFLOW_AUTH:-token}"
    assert _expand(env["MEMEFLOW_ALLOW_UNAUTHENTICATED_REMOTE"]) == "0"
    assert _expand(env["MEMEFLOW_ALLOWED_HOSTS"]) == "localhost,127.0.0.1,::1"
    assert env["MEMEFLOW_CURSOR_SECRET"] == "${MEMEFLOW_CURSOR_SECRET:-}"


def test_named_volumes_declared(compose, services):
    declared = set(compose["volumes"])
    used = {
        v.split(":")[0]
        for svc in services.values()
        for v in svc.get("volumes", [])
        if not v.startswith(("/", "."))
    }
    assert used <= declared
    assert {"pgdata", "redisdata", "storage"} <= declared


def test_dockerfile_installs_package_and_runs_unprivileged():
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11" in text
    assert re.search(r"pip install .*-e '\.\[ml\]'", text)
    assert "USER memeflow" in text
    assert "fonts-wqy-microhei" in text


def test_default_services_are_the_spec_building_blocks_and_lane_workers_serve_maintenance(services):
    """`docker compose up` without profiles starts no dedicated maintenance worker (SPEC §10): the
    lane workers consume its queue by default, so nothing may turn that off."""
    default = {name for name, svc in services.items() if not svc.get("profiles")}
    assert "worker-maintenance" not in default
    assert services["worker-maintenance"]["profiles"] == ["maintenance"]
    for lane in LANES:
        command = services[f"worker-{lane}"]["command"]
        env = services[f"worker-{lane}"]["environment"]
        assert "--no-maintenance" not in command and env.get("MEMEFLOW_WORKER_MAINTENANCE", "1") != "0"


def test_the_agent_worker_gets_time_to_finish_a_paid_call_on_stop(services):
    """A warm shutdown lets a call in flight finish (agent_timeout_s) and commit (COMPLETION_DRAIN_S);
    compose's default 10 s grace would SIGKILL it first and throw the paid result away."""
    from app.config import COMPLETION_DRAIN_S, Settings

    grace = services["worker-agent"]["stop_grace_period"]
    seconds = int(re.fullmatch(r"(\d+)s", grace).group(1))
    assert seconds >= Settings().agent_timeout_s + COMPLETION_DRAIN_S
    # an openai-compatible call may run its whole deadline (120 s), not only one read's timeout
    assert seconds >= Settings().agent_call_max_s + COMPLETION_DRAIN_S
    assert all("stop_grace_period" not in services[f"worker-{lane}"] for lane in ("visual", "embedding"))


#: Where the containers deliberately differ from a bare `memeflow` process: where the servers and
#: the shared files are, and the safer auth for a published API.
DEPLOYMENT_ONLY = {"MEMEFLOW_DATABASE_URL", "MEMEFLOW_BROKER_URL", "MEMEFLOW_STORAGE_DIR", "MEMEFLOW_VAR_DIR",
                   "MEMEFLOW_AUTH", "MEMEFLOW_ALLOWED_HOSTS"}


def test_compose_defaults_are_the_products_so_a_worker_added_outside_compose_agrees(compose):
    """README "Running it distributed" adds workers on machines without Docker that set only the
    URLs and the storage dir. Any other compose default that differs from the code's (the text
    model set fell behind when the query bank was added) makes those workers run another pipeline
    configuration than the compose ones: their jobs are replanned back and forth and fail with
    provider_config_mismatch, and the sweeps disagree about the scope's search model."""
    import dataclasses

    from app.config import Settings

    defaults = Settings()
    for name, raw in compose["x-memeflow-env"].items():
        value = _expand(str(raw))
        if name in DEPLOYMENT_ONLY or value == "":  # "" = unset, the code's default in force
            continue
        field = name.removeprefix("MEMEFLOW_").lower()
        assert field in {f.name for f in dataclasses.fields(Settings)}, name
        got = getattr(Settings.from_env({name: value}), field)
        assert got == getattr(defaults, field), f"{name}: compose {value!r}, code {getattr(defaults, field)!r}"


def test_only_the_agent_worker_holds_the_paid_agents_key(services):
    """The key bills the operator: every other service (the API, Flower, beat, the other lanes)
    runs without it, so a compromise of one of them does not leak it (docs/security.md)."""
    holders = {name for name, svc in services.items()
               if "MEMEFLOW_AGENT_API_KEY" in (svc.get("environment") or {})}
    assert holders == {"worker-agent"}
    assert services["worker-agent"]["environment"]["MEMEFLOW_DATABASE_URL"]  # the shared env kept
