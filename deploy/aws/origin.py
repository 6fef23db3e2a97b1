"""Deploy the Prism origin to one AWS region with boto3: EC2 behind Caddy, secrets in SSM.

One stack is a (name, region) pair; every resource is tagged ``prism:stack``,
``prism:role=origin`` and ``prism:region`` and found again by those tags, so
``apply`` is idempotent and a second region is an independent stack.

- Release: a wheel of this checkout and a hash-checked lock for the instance's
  Python (:mod:`deploy.release`), stored in the region's bucket
  ``prism-releases-<account>-<region>`` under ``origin/<name>/releases/<id>/``;
  the instance fetches them with its role and installs them with
  ``pip install --require-hashes``. The lock is reused (``origin/<name>/locks/``)
  while the dependencies and the target are unchanged, so the same tree is the
  same release.
- Image: Ubuntu 24.04 LTS (Python 3.12), from Canonical's SSM public
  parameter unless ``--ami`` names one; tagged ``prism:image`` and
  ``prism:python`` with the release (``prism:release``).
- Security group ``prism-origin-<name>``: TCP 443 from 0.0.0.0/0 and ::/0,
  nothing else (no SSH, no 80: Session Manager instead). Certificates come from
  ACME TLS-ALPN-01, which Caddy answers on 443.
- Secrets: one ``SecureString`` parameter per secret under
  ``<prefix><name>/``. A secret this deploy does not set is kept, never
  dropped (``--remove-secret`` deletes one).
- IAM role + instance profile ``prism-origin-<name>-<region>``: may read only
  that parameter path and the stack's release objects, plus Session Manager.
- Elastic IP: a stable address for the domain's DNS record.
- ``instances`` > 1 (:mod:`deploy.aws.fleet`): instead of the Elastic IP and the
  instance, a launch template, an Auto Scaling group and a Network Load Balancer
  (TLS with an ACM certificate for the domain, else TCP passthrough); upgrades by
  instance refresh.
- Updates are blue/green: a new launch spec (release, image, type, user-data)
  means a new instance; the Elastic IP moves to it only once it answers
  ``/healthz`` over HTTPS with the expected version, then the old one is
  terminated. A new instance that never gets healthy is terminated and the old
  one keeps serving. Same spec and changed secrets: the instance reboots (the
  unit refetches them at start). Nothing changed: nothing is touched.
  ``rollback`` relaunches the release that served before the current one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.aws.stack import (
    TAG_STACK,
    DeployConfigError,
    DeployResult,
    HealthCheck,
    OriginDeployConfig,
    Progress,
    ReleaseBuilder,
)
from deploy.aws.userdata import IMAGE
from deploy.release import wheel_choice
from prism.routes import HEALTH_PATH

if TYPE_CHECKING:
    import boto3

__all__ = ["DeployPlan", "PlanStep", "apply", "plan"]


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
    image: str
    python: str
    steps: tuple[PlanStep, ...]
    instances: int = 1
    wheel: str = ""  # which wheel the release ships and why ("" for a rollback)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(
    config: OriginDeployConfig, *, source: str = ".", rollback: bool = False, compiled: bool = True
) -> DeployPlan:
    """Describe what ``apply`` would do, without calling AWS, building or reading the network.

    Which wheel ships is decided from this machine's tools (``compiled``: unless the pure
    one is asked for), as the build will decide it.
    """
    path = config.parameter_path
    target = config.target
    wheel = ""
    bucket = f"prism-releases-<account>-{config.region}"
    kept = "keep stored parameters this deploy does not set"
    if config.remove_secrets:
        kept += f"; delete {', '.join(config.remove_secrets)}"
    if rollback:
        release_steps = [
            PlanStep("release", "previous", "the release that served before the current one"),
        ]
    else:
        choice = wheel_choice(Path(source), target, compiled=compiled)
        wheel = choice.describe(target.arch, target.python)
        build = f"build a reproducible wheel of the checkout: {wheel}"
        if choice.compiled:
            build += "; the pure py3-none-any wheel if the compiled build fails"
        release_steps = [
            PlanStep("wheel", source, build),
            PlanStep(
                "lock",
                f"{bucket}/{config.release_prefix}locks/",
                f"reuse, or pin with hashes for Python {target.python} on {target.platform}",
            ),
            PlanStep(
                "s3-object",
                f"{bucket}/{config.release_prefix}releases/<release id>/",
                "upload the wheel and requirements.txt unless stored",
            ),
        ]
    steps = [
        PlanStep(
            "security-group",
            config.security_group_name,
            "create or reuse; allow only tcp/443 from 0.0.0.0/0 and ::/0, revoke anything else",
        ),
        *(
            PlanStep("ssm-parameter", f"{name} = ***", "put SecureString (overwrite if changed)")
            for name in config.parameter_names
        ),
        PlanStep("ssm-parameter", f"{path}/*", kept),
        *release_steps,
        PlanStep(
            "iam-role",
            config.role_name,
            f"create or reuse role + instance profile; may read only {path}/* and the "
            "stack's release objects; Session Manager",
        ),
        *(_fleet_steps(config) if config.fleet else _instance_steps(config)),
    ]
    return DeployPlan(
        region=config.region,
        name=config.name,
        site=config.domain or _address(config),
        tls=_tls_mode(config),
        image=IMAGE,
        python=target.python,
        steps=tuple(steps),
        instances=config.instances,
        wheel=wheel,
    )


def _instance_steps(config: OriginDeployConfig) -> list[PlanStep]:
    target = config.target
    return [
        PlanStep("elastic-ip", config.security_group_name, "allocate or reuse"),
        PlanStep(
            "instance",
            f"{TAG_STACK}={config.name}",
            f"launch {config.instance_type} ({IMAGE}, Python {target.python}) from "
            f"{config.ami_source} when the release or launch spec changed; move the Elastic "
            "IP once it answers /healthz over HTTPS with the release, then terminate the old "
            "one (an unhealthy new one is terminated instead); reboot when only secrets "
            "changed; otherwise nothing",
        ),
    ]


def _fleet_steps(config: OriginDeployConfig) -> list[PlanStep]:
    # Imported here, as apply's steps are: they import botocore, which a plan never needs.
    from deploy.aws.balancer import TLS_POLICY
    from deploy.aws.fleet import REFRESH_PREFERENCES

    target, name = config.target, config.fleet_name
    low, desired, high = config.capacity
    protocol = "TLS" if config.domain else "TCP"
    steps = []
    if config.domain:
        steps.append(
            PlanStep(
                "acm-certificate",
                config.domain,
                "request or reuse (DNS validation: add the CNAME it names, then rerun)",
            )
        )
    return [
        *steps,
        PlanStep(
            "target-group",
            config.elb_name(protocol.lower()),
            f"create or reuse; {protocol}:443 to Caddy, health check HTTPS {HEALTH_PATH}",
        ),
        PlanStep(
            "load-balancer",
            config.elb_name("nlb"),
            "create or reuse an internet-facing Network Load Balancer in every default "
            "subnet, cross-zone",
        ),
        PlanStep(
            "listener",
            f"{protocol}:443",
            (
                f"forward to the target group, certificate for {config.domain}, {TLS_POLICY}"
                if config.domain
                else "forward TCP to the target group (Caddy's self-signed certificate)"
            ),
        ),
        PlanStep(
            "launch-template",
            name,
            f"a version per launch spec: {config.instance_type} ({IMAGE}, Python "
            f"{target.python}) from {config.ami_source}, the release's hash-checked user-data; "
            "reuse the version of an unchanged spec",
        ),
        PlanStep(
            "auto-scaling-group",
            name,
            f"create or resize to {desired} instances (min {low}, max {high}), health check "
            "type ELB, in the target group",
        ),
        PlanStep(
            "instance-refresh",
            name,
            "when the launch spec or the secrets changed: replace the instances keeping "
            f"capacity (MinHealthyPercentage {REFRESH_PREFERENCES['MinHealthyPercentage']}, "
            f"MaxHealthyPercentage {REFRESH_PREFERENCES['MaxHealthyPercentage']}, "
            "AutoRollback), then check /healthz through the load balancer for the release; "
            "refresh back to the serving version if it fails; otherwise nothing",
        ),
    ]


def _address(config: OriginDeployConfig) -> str:
    return "the load balancer's DNS name" if config.fleet else "the stack's Elastic IP"


def apply(
    config: OriginDeployConfig,
    session: boto3.Session,
    progress: Progress = lambda _: None,
    *,
    release: ReleaseBuilder | None = None,
    lock_key: str = "",
    rollback: bool = False,
    health_check: HealthCheck | None = None,
    keep_failed: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> DeployResult:
    """Create or update the stack for ``config`` and return where the origin runs.

    ``release`` builds the release (given the stored lock for ``lock_key``, if
    any); with ``rollback`` the previous release is relaunched instead.
    """
    # Imported here: boto3 is slow to import, and only the command that deploys pays for it.
    from deploy.aws.deployer import Deployer
    from deploy.aws.health import check_health

    if (release is None) == (not rollback):
        raise DeployConfigError("give either a release to build or rollback, not both")
    if keep_failed and config.fleet:
        raise DeployConfigError(
            "--keep-failed is for one instance; an instance refresh rolls failed ones back"
        )
    deployer = Deployer(
        config,
        session,
        progress,
        sleep,
        health_check=health_check or check_health,
        keep_failed=keep_failed,
    )
    return deployer.run(release, lock_key, rollback=rollback)


def _tls_mode(config: OriginDeployConfig) -> str:
    if config.fleet:
        if config.domain:
            return (
                "ACM certificate on the load balancer's TLS listener (point the domain at "
                "its DNS name), re-encrypted to Caddy's tls internal on each instance"
            )
        return "TCP passthrough to Caddy's tls internal (self-signed; the edge needs --domain)"
    if config.domain:
        return "public certificate via ACME TLS-ALPN-01 on 443 (point the domain at the Elastic IP)"
    return "tls internal (self-signed; the edge needs --domain)"
