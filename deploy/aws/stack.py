"""One origin stack on AWS, as every deploy step sees it: its configuration (names, tags,
parameter path, secrets), the release it runs, what a deploy did, and the errors the steps raise.

The bottom of :mod:`deploy.aws`'s layers: :mod:`~deploy.aws.access`,
:mod:`~deploy.aws.releases`, :mod:`~deploy.aws.deployer` and :mod:`~deploy.aws.origin`
(``plan`` and ``apply``) build on it; it imports none of them.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from deploy.aws.userdata import ami_parameters, architecture, render_user_data
from deploy.release import TARGETS, Release, ReleaseTarget
from prism import parse_key_secrets

if TYPE_CHECKING:
    from mypy_boto3_ec2.type_defs import TagTypeDef

__all__ = [
    "BASE_SECRETS",
    "DEFAULT_INSTANCE_TYPE",
    "DEFAULT_NAME",
    "DEFAULT_PARAMETER_PREFIX",
    "DEFAULT_REGION",
    "MAX_INSTANCES",
    "PROVIDER_KEYS",
    "TAG_REGION",
    "TAG_ROLE",
    "TAG_STACK",
    "Action",
    "DeployConfigError",
    "DeployError",
    "DeployResult",
    "HealthCheck",
    "OriginDeployConfig",
    "Progress",
    "ReleaseBuilder",
    "ReleaseRef",
    "required_secrets",
]

DEFAULT_REGION = "ap-south-1"
DEFAULT_NAME = "main"
DEFAULT_INSTANCE_TYPE = "t3.small"
DEFAULT_PARAMETER_PREFIX = "/prism/origin/"
# What the origin refuses to start without (origin/settings.py); REDIS_URL because the
# instance runs no Redis of its own.
BASE_SECRETS = ("REDIS_URL", "PRISM_KEY_SECRET", "PRISM_FORWARD_SECRET")
# Without PRISM_PROVIDERS_FILE the origin configures a provider per key that is set.
PROVIDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
_MIN_FORWARD_SECRET = 16  # origin/settings.py's rule
# Every resource of a stack carries these three, and is found again by them.
TAG_STACK, TAG_ROLE, TAG_REGION = "prism:stack", "prism:role", "prism:region"
_MAX_SECRET_BYTES = 8192  # the SSM Advanced tier limit; Intelligent-Tiering picks the tier
MAX_INSTANCES = 100  # a guard against a typo, far below any account's EC2 quota

_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_INSTANCE_TYPE_RE = re.compile(r"^[a-z0-9-]+\.[a-z0-9]+$")
_DOMAIN_RE = re.compile(r"^(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_AMI_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
_PREFIX_RE = re.compile(r"^/(?:[A-Za-z0-9_.-]+/)*$")
_SECRET_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")

Progress = Callable[[str], None]
Action = Literal["created", "updated", "replaced", "unchanged"]
#: ``(address, expected release id) -> None`` when ``https://address/healthz`` answers
#: healthy with that version, else why not. Injected so tests can play the instance.
HealthCheck = Callable[[str, str], str | None]
#: Given the stored lock for the checkout's dependencies (or None), the release to ship.
ReleaseBuilder = Callable[[str | None], Release]


class DeployError(Exception):
    """A deploy step failed. Messages name resources, never secret values."""


class DeployConfigError(DeployError, ValueError):
    """The deploy configuration is invalid."""


def required_secrets(secrets: Mapping[str, str]) -> tuple[str, ...]:
    """The secrets the origin needs given these: the base ones plus the provider keys.

    With ``PRISM_PROVIDERS_FILE`` (its content), every ``api_key_env`` it names;
    without, at least one of :data:`PROVIDER_KEYS` (checked by the caller).
    """
    providers = secrets.get("PRISM_PROVIDERS_FILE")
    if not providers:
        return BASE_SECRETS
    try:
        tables = tomllib.loads(providers).get("providers", {})
    except tomllib.TOMLDecodeError as error:
        raise DeployConfigError(f"PRISM_PROVIDERS_FILE is not valid TOML: {error}") from None
    if not isinstance(tables, dict) or not tables:
        raise DeployConfigError("PRISM_PROVIDERS_FILE has no [providers.NAME] tables")
    keys = [t.get("api_key_env") for t in tables.values() if isinstance(t, dict)]
    return (*BASE_SECRETS, *sorted({k for k in keys if isinstance(k, str) and k}))


@dataclass(frozen=True, slots=True)
class ReleaseRef:
    """A stored release: enough to render user-data and check the instance's version."""

    id: str
    wheel_name: str
    files: Mapping[str, str]  # object name -> sha256, as the instance checks them
    python: str
    image: str

    @classmethod
    def of(cls, release: Release) -> ReleaseRef:
        requirements = hashlib.sha256(release.requirements.encode()).hexdigest()
        return cls(
            id=release.id,
            wheel_name=release.wheel_name,
            files={release.wheel_name: release.wheel_sha256, "requirements.txt": requirements},
            python=release.target.python,
            image=release.target.os,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "files": dict(self.files)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReleaseRef:
        return cls(
            id=str(data["id"]),
            wheel_name=str(data["wheel_name"]),
            files={str(k): str(v) for k, v in dict(data["files"]).items()},
            python=str(data["python"]),
            image=str(data["image"]),
        )


@dataclass(frozen=True, kw_only=True)
class OriginDeployConfig:
    """What to deploy where. ``secrets`` maps env var name → value and is never printed."""

    secrets: Mapping[str, str] = field(repr=False)
    region: str = DEFAULT_REGION
    name: str = DEFAULT_NAME
    instance_type: str = DEFAULT_INSTANCE_TYPE
    domain: str | None = None
    ami: str | None = None
    parameter_prefix: str = DEFAULT_PARAMETER_PREFIX
    remove_secrets: tuple[str, ...] = ()
    #: 1: one instance with an Elastic IP; more: an Auto Scaling group behind a load
    #: balancer (:mod:`deploy.aws.fleet`), ``min_instances``..``max_instances`` around it.
    instances: int = 1
    min_instances: int | None = None
    max_instances: int | None = None

    def __post_init__(self) -> None:
        checks = (
            ("region", self.region, _REGION_RE),
            ("name", self.name, _NAME_RE),
            ("instance type", self.instance_type, _INSTANCE_TYPE_RE),
            ("parameter prefix", self.parameter_prefix, _PREFIX_RE),
        )
        for label, value, pattern in checks:
            if not pattern.match(value):
                raise DeployConfigError(f"invalid {label}: {value!r}")
        if self.parameter_prefix.lower().startswith(("/aws/", "/ssm/")):
            raise DeployConfigError("parameter prefix must not start with /aws/ or /ssm/")
        if self.domain is not None:
            object.__setattr__(self, "domain", self.domain.lower().rstrip("."))
            if not _DOMAIN_RE.match(self.domain or ""):
                raise DeployConfigError(f"invalid domain: {self.domain!r}")
        if self.ami is not None and not _AMI_RE.match(self.ami):
            raise DeployConfigError(f"invalid AMI id: {self.ami!r}")
        self._check_capacity()
        self._check_secrets()
        # Freeze a private copy so later changes to the caller's dict cannot leak in.
        object.__setattr__(self, "secrets", MappingProxyType(dict(self.secrets)))
        object.__setattr__(self, "remove_secrets", tuple(self.remove_secrets))

    def _check_capacity(self) -> None:
        if not 1 <= self.instances <= MAX_INSTANCES:
            raise DeployConfigError(f"instances must be 1 to {MAX_INSTANCES}: {self.instances}")
        if not self.fleet:
            if (self.min_instances, self.max_instances) != (None, None):
                raise DeployConfigError("--min and --max need --instances 2 or more")
            return
        low, desired, high = self.capacity
        if not 1 <= low <= desired <= high <= MAX_INSTANCES:
            raise DeployConfigError(
                f"need 1 <= min ({low}) <= instances ({desired}) <= max ({high}) <= {MAX_INSTANCES}"
            )

    def _check_secrets(self) -> None:
        required = required_secrets(self.secrets)
        missing = [name for name in required if not self.secrets.get(name)]
        if missing:
            raise DeployConfigError(f"missing required secret(s): {', '.join(missing)}")
        if "PRISM_PROVIDERS_FILE" not in self.secrets and not any(
            self.secrets.get(k) for k in PROVIDER_KEYS
        ):
            raise DeployConfigError(
                f"no provider key: set {' or '.join(PROVIDER_KEYS)}, or PRISM_PROVIDERS_FILE"
            )
        try:
            parse_key_secrets(self.secrets["PRISM_KEY_SECRET"])
        except ValueError as error:
            raise DeployConfigError(f"invalid PRISM_KEY_SECRET: {error}") from None
        if len(self.secrets["PRISM_FORWARD_SECRET"]) < _MIN_FORWARD_SECRET:
            raise DeployConfigError(
                f"PRISM_FORWARD_SECRET must be at least {_MIN_FORWARD_SECRET} characters"
            )
        for name, value in self.secrets.items():
            if not _SECRET_NAME_RE.match(name):
                raise DeployConfigError(f"invalid secret name: {name!r}")
            if not value:
                raise DeployConfigError(f"secret {name} is empty")
            if len(value.encode()) > _MAX_SECRET_BYTES:
                raise DeployConfigError(f"secret {name} is larger than {_MAX_SECRET_BYTES} bytes")
        for name in self.remove_secrets:
            if not _SECRET_NAME_RE.match(name):
                raise DeployConfigError(f"invalid secret name: {name!r}")
            if name in self.secrets or name in required:
                raise DeployConfigError(f"cannot both set and remove secret {name}")

    @property
    def parameter_path(self) -> str:
        """SSM path holding this stack's parameters (no trailing slash)."""
        return f"{self.parameter_prefix}{self.name}"

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """Full SSM parameter names of the secrets this deploy sets, sorted."""
        return tuple(f"{self.parameter_path}/{name}" for name in sorted(self.secrets))

    @property
    def security_group_name(self) -> str:
        return f"prism-origin-{self.name}"

    @property
    def role_name(self) -> str:
        # IAM is global: the region keeps two regional stacks from sharing a role.
        return f"prism-origin-{self.name}-{self.region}"

    @property
    def fleet(self) -> bool:
        """More than one instance: an Auto Scaling group behind a load balancer."""
        return self.instances > 1

    @property
    def capacity(self) -> tuple[int, int, int]:
        """The group's (min, desired, max) size; min and max default to ``instances``."""
        low = self.instances if self.min_instances is None else self.min_instances
        high = self.instances if self.max_instances is None else self.max_instances
        return low, self.instances, high

    @property
    def fleet_name(self) -> str:
        """The launch template's and the Auto Scaling group's name."""
        return f"prism-origin-{self.name}"

    def elb_name(self, kind: str) -> str:
        """A load balancer or target group name: ELB allows 32 characters, so a long
        stack name is shortened and made unique again by a hash of it."""
        name = f"prism-{self.name}-{kind}"
        if len(name) <= 32:
            return name
        digest = hashlib.sha256(self.name.encode()).hexdigest()[:6]
        return f"prism-{self.name[: 32 - len(kind) - 14].rstrip('-')}-{digest}-{kind}"

    @property
    def release_prefix(self) -> str:
        """The stack's key prefix in the region's release bucket."""
        return f"origin/{self.name}/"

    @property
    def request_log_prefix(self) -> str:
        """Where in that bucket the stack's origins write the request log's files."""
        return f"{self.release_prefix}logs/requests/"

    @property
    def target(self) -> ReleaseTarget:
        """The instance's image, Python and platform (from the instance type's architecture)."""
        return TARGETS["aarch64" if architecture(self.instance_type) == "arm64" else "x86_64"]

    @property
    def ami_source(self) -> str:
        """The explicit AMI, or the SSM public parameter it will be looked up from."""
        return self.ami or " or ".join(ami_parameters(self.instance_type))

    def tags(self) -> list[TagTypeDef]:
        return [
            {"Key": TAG_STACK, "Value": self.name},
            {"Key": TAG_ROLE, "Value": "origin"},
            {"Key": TAG_REGION, "Value": self.region},
        ]

    def user_data(self, site: str, bucket: str, release: ReleaseRef) -> str:
        """Cloud-init script serving ``site`` (the domain, or the Elastic IP without one)."""
        return render_user_data(
            region=self.region,
            parameter_path=self.parameter_path,
            required=required_secrets(self.secrets),
            site=site,
            acme=self.domain is not None,
            bucket=bucket,
            prefix=f"{self.release_prefix}releases/{release.id}/",
            release=release.id,
            files=release.files,
            load_balanced=self.fleet,
            log_prefix=self.request_log_prefix,
        )


@dataclass(frozen=True)
class DeployResult:
    """What ``apply`` did and where the origin now lives."""

    region: str
    name: str
    action: Action
    instance_id: str
    public_ip: str
    public_dns: str | None
    url: str
    security_group_id: str
    allocation_id: str
    instance_profile: str
    release: str
    previous_release: str | None
    bucket: str
    parameter_names: tuple[str, ...]
    parameters_changed: tuple[str, ...]
    parameters_kept: tuple[str, ...]
    restarted: bool
    rolled_back: bool = False
    terminated_instance_ids: tuple[str, ...] = ()
    # A fleet (``instances`` > 1): no ``instance_id``, ``public_ip`` or ``allocation_id``.
    instances: int = 1
    instance_ids: tuple[str, ...] = ()
    load_balancer: str | None = None  # its DNS name, what the domain points at
    launch_template_version: int | None = None
    instance_refresh_id: str | None = None
    certificate_arn: str | None = None

    @property
    def created(self) -> bool:
        return self.action == "created"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
