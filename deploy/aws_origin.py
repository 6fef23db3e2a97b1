"""Deploy the Prism origin to one AWS region with boto3: EC2 behind Caddy, secrets in SSM.

One stack is a (name, region) pair; every resource is tagged ``prism:stack``,
``prism:role=origin`` and ``prism:region`` and found again by those tags, so
``apply`` is idempotent and a second region is an independent stack.

- Security group ``prism-origin-<name>``: TCP 443 from 0.0.0.0/0 and ::/0,
  nothing else (no SSH, no 80). Certificates come from ACME TLS-ALPN-01, which
  Caddy answers on 443; the HTTP-01 challenge is disabled in the Caddyfile.
- Secrets: one ``SecureString`` parameter per secret under
  ``<prefix><name>/`` (scoped by stack name so two stacks in a region never
  read or prune each other's). Parameters no longer configured are deleted.
- IAM role + instance profile ``prism-origin-<name>-<region>`` that may read
  only that parameter path (the AWS-managed ``aws/ssm`` key needs no KMS grant).
- Elastic IP: a stable address for the domain's DNS record across instance
  replacement and stop/start. Without ``--domain`` Caddy serves
  ``https://<elastic ip>`` with ``tls internal`` (self-signed): fine for a
  smoke test, but the edge needs a domain with a public certificate.
- Updates: the instance carries a hash of its launch spec (user-data,
  instance type, explicit AMI). Same hash: parameters are synced and, if any
  changed, the instance reboots so the unit's ``ExecStartPre`` refetches
  them (no SSM agent or ``send_command`` needed). Different hash: a new
  instance is launched, the Elastic IP moves to it, the old one is
  terminated (brief downtime while the new one installs; the origin is
  stateless, Redis holds the cache).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from deploy.aws_userdata import ami_parameters, render_user_data

if TYPE_CHECKING:
    import boto3
    from mypy_boto3_ec2.type_defs import TagTypeDef

__all__ = [
    "DEFAULT_INSTANCE_TYPE",
    "DEFAULT_NAME",
    "DEFAULT_PACKAGE",
    "DEFAULT_PARAMETER_PREFIX",
    "DEFAULT_REGION",
    "REQUIRED_SECRETS",
    "DeployConfigError",
    "DeployError",
    "DeployPlan",
    "DeployResult",
    "OriginDeployConfig",
    "PlanStep",
    "apply",
    "plan",
]

DEFAULT_REGION = "ap-south-1"
DEFAULT_NAME = "main"
DEFAULT_INSTANCE_TYPE = "t3.small"
DEFAULT_PACKAGE = "prism-gateway"
DEFAULT_PARAMETER_PREFIX = "/prism/origin/"
REQUIRED_SECRETS = ("REDIS_URL", "PRISM_KEY_SECRET")
_TAG_STACK, _TAG_ROLE, _TAG_REGION = "prism:stack", "prism:role", "prism:region"
_MAX_SECRET_BYTES = 8192  # the SSM Advanced tier limit; Intelligent-Tiering picks the tier

_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_INSTANCE_TYPE_RE = re.compile(r"^[a-z0-9-]+\.[a-z0-9]+$")
_DOMAIN_RE = re.compile(r"^(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
_AMI_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
_PREFIX_RE = re.compile(r"^/(?:[A-Za-z0-9_.-]+/)*$")
_URL_CREDENTIALS = re.compile(r"://[^/\s]*@")
_SECRET_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")

Progress = Callable[[str], None]
Action = Literal["created", "updated", "replaced"]


class DeployError(Exception):
    """A deploy step failed. Messages name resources, never secret values."""


class DeployConfigError(DeployError, ValueError):
    """The deploy configuration is invalid."""


@dataclass(frozen=True, kw_only=True)
class OriginDeployConfig:
    """What to deploy where. ``secrets`` maps env var name → value and is never printed."""

    secrets: Mapping[str, str] = field(repr=False)
    region: str = DEFAULT_REGION
    name: str = DEFAULT_NAME
    instance_type: str = DEFAULT_INSTANCE_TYPE
    domain: str | None = None
    ami: str | None = None
    package: str = DEFAULT_PACKAGE
    parameter_prefix: str = DEFAULT_PARAMETER_PREFIX

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
        if _URL_CREDENTIALS.search(self.package):
            # The spec lands in user-data, which anyone who can describe the instance reads.
            raise DeployConfigError("package spec must not embed credentials (user:token@)")
        # A leading '-' would make pip read the spec as an option.
        if not self.package.strip() or self.package.startswith("-") or "\n" in self.package:
            raise DeployConfigError("package spec must be one non-empty line not starting with '-'")
        self._check_secrets()
        # Freeze a private copy so later changes to the caller's dict cannot leak in.
        object.__setattr__(self, "secrets", MappingProxyType(dict(self.secrets)))

    def _check_secrets(self) -> None:
        missing = [name for name in REQUIRED_SECRETS if not self.secrets.get(name)]
        if missing:
            raise DeployConfigError(f"missing required secret(s): {', '.join(missing)}")
        for name, value in self.secrets.items():
            if not _SECRET_NAME_RE.match(name):
                raise DeployConfigError(f"invalid secret name: {name!r}")
            if not value:
                raise DeployConfigError(f"secret {name} is empty")
            if len(value.encode()) > _MAX_SECRET_BYTES:
                raise DeployConfigError(f"secret {name} is larger than {_MAX_SECRET_BYTES} bytes")

    @property
    def parameter_path(self) -> str:
        """SSM path holding this stack's parameters (no trailing slash)."""
        return f"{self.parameter_prefix}{self.name}"

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """Full SSM parameter names, sorted."""
        return tuple(f"{self.parameter_path}/{name}" for name in sorted(self.secrets))

    @property
    def security_group_name(self) -> str:
        return f"prism-origin-{self.name}"

    @property
    def role_name(self) -> str:
        # IAM is global: the region keeps two regional stacks from sharing a role.
        return f"prism-origin-{self.name}-{self.region}"

    @property
    def ami_source(self) -> str:
        """The explicit AMI, or the SSM public parameters it will be looked up from."""
        return self.ami or " or ".join(ami_parameters(self.instance_type))

    def tags(self) -> list[TagTypeDef]:
        return [
            {"Key": _TAG_STACK, "Value": self.name},
            {"Key": _TAG_ROLE, "Value": "origin"},
            {"Key": _TAG_REGION, "Value": self.region},
        ]

    def user_data(self, site: str) -> str:
        """Cloud-init script serving ``site`` (the domain, or the Elastic IP without one)."""
        return render_user_data(
            region=self.region,
            parameter_path=self.parameter_path,
            required=REQUIRED_SECRETS,
            package=self.package,
            site=site,
            acme=self.domain is not None,
        )


@dataclass(frozen=True)
class PlanStep:
    """One resource and what ``apply`` does to it."""

    resource: str
    name: str
    action: str


@dataclass(frozen=True)
class DeployPlan:
    """A pure description of ``apply``: resource names only, no values."""

    region: str
    name: str
    site: str
    tls: str
    steps: tuple[PlanStep, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    parameter_names: tuple[str, ...]
    parameters_changed: tuple[str, ...]
    restarted: bool
    terminated_instance_ids: tuple[str, ...] = ()

    @property
    def created(self) -> bool:
        return self.action == "created"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(config: OriginDeployConfig) -> DeployPlan:
    """Describe what ``apply`` would do, without calling AWS."""
    path = config.parameter_path
    steps = [
        PlanStep(
            "security-group",
            config.security_group_name,
            "create or reuse; allow only tcp/443 from 0.0.0.0/0 and ::/0, revoke anything else",
        ),
        *(
            PlanStep("ssm-parameter", name, "put SecureString (overwrite if changed)")
            for name in config.parameter_names
        ),
        PlanStep("ssm-parameter", f"{path}/*", "delete parameters not listed above"),
        PlanStep(
            "iam-role",
            config.role_name,
            f"create or reuse role + instance profile; may read only {path}/*",
        ),
        PlanStep("elastic-ip", config.security_group_name, "allocate or reuse"),
        PlanStep(
            "instance",
            f"{_TAG_STACK}={config.name}",
            f"launch {config.instance_type} from {config.ami_source} with package "
            f"{config.package!r}; if it exists: reboot when secrets changed, replace "
            "when user-data, package, instance type or AMI changed",
        ),
    ]
    return DeployPlan(
        region=config.region,
        name=config.name,
        site=config.domain or "the stack's Elastic IP",
        tls=_tls_mode(config),
        steps=tuple(steps),
    )


def apply(
    config: OriginDeployConfig,
    session: boto3.Session,
    progress: Progress = lambda _: None,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> DeployResult:
    """Create or update the stack for ``config`` and return where the origin runs."""
    # Imported here: aws_resources imports this module's config, result and errors.
    from deploy.aws_resources import Deployer

    return Deployer(config, session, progress, sleep).run()


def _tls_mode(config: OriginDeployConfig) -> str:
    if config.domain:
        return "public certificate via ACME TLS-ALPN-01 on 443 (point the domain at the Elastic IP)"
    return "tls internal (self-signed; the edge needs --domain)"
