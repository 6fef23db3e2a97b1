"""The AWS steps of ``prism deploy origin``, run in order by ``Deployer``: secrets, release,
address, and the blue/green instance swap (the access steps are in :mod:`deploy.aws.access`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast

from botocore.exceptions import ClientError, WaiterError

from deploy.aws.access import AccessSteps
from deploy.aws.releases import ReleaseStore, bucket_name
from deploy.aws.stack import (
    Action,
    DeployError,
    DeployResult,
    HealthCheck,
    OriginDeployConfig,
    Progress,
    ReleaseBuilder,
    ReleaseRef,
)
from deploy.aws.userdata import IMAGE, ami_parameters

if TYPE_CHECKING:
    import boto3
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.literals import InstanceTypeType
    from mypy_boto3_ec2.type_defs import (
        FilterTypeDef,
        InstanceTypeDef,
        TagSpecificationTypeDef,
        TagTypeDef,
    )
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_ssm import SSMClient

__all__ = ["Deployer"]

_TAG_LAUNCH = "prism:launch"  # hash of the launch spec; a new hash means a new instance
_TAG_RELEASE = "prism:release"  # the release id the instance runs
_LIVE_STATES = ["pending", "running", "stopping", "stopped"]


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", "Unknown"))


def _tag(instance: InstanceTypeDef, key: str) -> str | None:
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == key), None)


def _launch_hash(config: OriginDeployConfig, user_data: str) -> str:
    # The looked-up "latest" AMI is left out on purpose: a new Ubuntu 24.04 build
    # alone should not replace a healthy instance.
    spec = {
        "user_data": user_data,
        "type": config.instance_type,
        "ami": config.ami or "latest",
        "image": IMAGE,
        "python": config.target.python,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


class Deployer(AccessSteps):
    """One ``apply`` run: the clients, the config and the progress sink, shared by the steps."""

    def __init__(
        self,
        config: OriginDeployConfig,
        session: boto3.Session,
        progress: Progress,
        sleep: Callable[[float], None],
        *,
        health_check: HealthCheck,
        keep_failed: bool = False,
    ) -> None:
        self.config, self.progress, self.sleep = config, progress, sleep
        self.health_check, self.keep_failed = health_check, keep_failed
        self.ec2: EC2Client = session.client("ec2", region_name=config.region)
        self.ssm: SSMClient = session.client("ssm", region_name=config.region)
        self.s3: S3Client = session.client("s3", region_name=config.region)
        # No IAM/STS stubs are installed; these two stay untyped.
        self.iam: Any = session.client("iam", region_name=config.region)
        self.sts: Any = session.client("sts", region_name=config.region)

    def run(self, build: ReleaseBuilder | None, lock_key: str, *, rollback: bool) -> DeployResult:
        config, progress = self.config, self.progress
        progress("Checking AWS credentials")
        arn: str = self.sts.get_caller_identity()["Arn"]
        partition, account = arn.split(":")[1], arn.split(":")[4]
        group_id = self.security_group()
        changed, kept = self.parameters()
        store = ReleaseStore(
            self.s3, bucket_name(account, config.region), config.release_prefix, progress
        )
        store.ensure_bucket(
            config.region, [{"Key": t["Key"], "Value": t["Value"]} for t in config.tags()]
        )
        allocation_id, public_ip = self.elastic_ip()
        instances = self.instances()
        serving = self.serving(instances, allocation_id)
        serving_release = _tag(serving, _TAG_RELEASE) if serving else None
        if rollback:
            ref = self.previous(store, serving_release)
        else:
            assert build is not None
            ref = self.release(store, build, lock_key)
        profile, profile_is_new = self.instance_profile(
            partition=partition, account=account, bucket=store.bucket
        )
        user_data = config.user_data(config.domain or public_ip, store.bucket, ref)
        launch = _launch_hash(config, user_data)

        restarted = False
        action: Action = "unchanged"
        if serving is not None and _tag(serving, _TAG_LAUNCH) == launch:
            instance_id = serving["InstanceId"]
            progress(f"Release {ref.id} already serves on {instance_id}")
            restarted = self.refresh(serving, secrets_changed=bool(changed))
            if changed or restarted:
                action = "updated"
        else:
            instance_id = self.bring_up(
                instances, ref, launch, group_id, profile, user_data, retry=profile_is_new
            )
            self.associate(allocation_id, instance_id)
            action = "replaced" if serving is not None else "created"
        history = store.history()
        if not history or history[-1].id != ref.id:
            store.record(ref)
        stale = tuple(i["InstanceId"] for i in instances if i["InstanceId"] != instance_id)
        if stale:
            progress(f"Terminating previous instance(s) {', '.join(stale)}")
            self.ec2.terminate_instances(InstanceIds=list(stale))
            if action == "unchanged":
                action = "updated"

        final = self.ec2.describe_instances(InstanceIds=[instance_id])
        instance = final["Reservations"][0]["Instances"][0]
        ip = instance.get("PublicIpAddress") or public_ip
        return DeployResult(
            region=config.region,
            name=config.name,
            action=action,
            instance_id=instance_id,
            public_ip=ip,
            public_dns=instance.get("PublicDnsName") or None,
            url=f"https://{config.domain or ip}",
            security_group_id=group_id,
            allocation_id=allocation_id,
            instance_profile=profile,
            release=ref.id,
            previous_release=serving_release if serving_release != ref.id else None,
            bucket=store.bucket,
            parameter_names=config.parameter_names,
            parameters_changed=tuple(changed),
            parameters_kept=tuple(kept),
            restarted=restarted,
            rolled_back=rollback,
            terminated_instance_ids=stale,
        )

    def release(self, store: ReleaseStore, build: ReleaseBuilder, lock_key: str) -> ReleaseRef:
        """Build this checkout's release (reusing the stored lock) and store it."""
        target = self.config.target
        cached = store.lock(lock_key) if lock_key else None
        if cached is None:
            self.progress(
                f"Building the wheel and pinning its dependencies for Python {target.python} "
                f"on {target.platform}"
            )
        else:
            self.progress(f"Building the wheel (dependencies unchanged: reusing lock {lock_key})")
        release = build(cached)
        if cached is None and lock_key:
            store.store_lock(lock_key, release.lock)
        if not store.store(release):
            self.progress(f"Release {release.id} is already stored")
        return ReleaseRef.of(release)

    def previous(self, store: ReleaseStore, serving: str | None) -> ReleaseRef:
        """The release that served before ``serving`` (for ``--rollback``)."""
        if serving is None:
            raise DeployError(f"nothing to roll back: no origin {self.config.name} serves")
        earlier = [r for r in store.history() if r.id != serving]
        if not earlier:
            raise DeployError(f"nothing to roll back to: release {serving} is the only one")
        ref = earlier[-1]
        if not store.stored(ref):
            raise DeployError(f"release {ref.id} is no longer stored in s3://{store.bucket}")
        self.progress(f"Rolling back from release {serving} to {ref.id}")
        return ref

    def serving(
        self, instances: list[InstanceTypeDef], allocation_id: str
    ) -> InstanceTypeDef | None:
        """The instance the Elastic IP points at (the newest one if it points nowhere)."""
        address = self.ec2.describe_addresses(AllocationIds=[allocation_id])["Addresses"][0]
        attached = address.get("InstanceId")
        for instance in instances:
            if instance["InstanceId"] == attached:
                return instance
        return None

    def bring_up(
        self,
        instances: list[InstanceTypeDef],
        ref: ReleaseRef,
        launch: str,
        group_id: str,
        profile: str,
        user_data: str,
        *,
        retry: bool,
    ) -> str:
        """A running, healthy instance of ``ref`` (launched unless one is already up)."""
        config, progress = self.config, self.progress
        waiting = [i for i in instances if _tag(i, _TAG_LAUNCH) == launch]
        if waiting:
            instance_id = waiting[-1]["InstanceId"]
            progress(f"Resuming {instance_id}, launched earlier for release {ref.id}")
            if waiting[-1]["State"]["Name"] in ("stopping", "stopped"):
                self.wait("instance_stopped", instance_id)
                self.ec2.start_instances(InstanceIds=[instance_id])
        else:
            if instances:
                progress(f"Launch spec changed (release {ref.id}): starting a new instance")
            ami = config.ami or self.resolve_ami()
            instance_id = self.launch(ami, group_id, profile, user_data, launch, ref, retry=retry)
        self.wait("instance_running", instance_id)
        found = self.ec2.describe_instances(InstanceIds=[instance_id])
        address = found["Reservations"][0]["Instances"][0].get("PublicIpAddress")
        problem = "it has no public address to check"
        if address:
            progress(f"Waiting for https://{address}/healthz to report release {ref.id}")
            problem = self.health_check(address, ref.id) or ""
        if not problem:
            progress(f"{instance_id} is healthy with release {ref.id}")
            return instance_id
        if self.keep_failed:
            fate = (
                f"kept it for inspection (aws ssm start-session --target {instance_id}; "
                "journalctl -u prism-origin -u caddy)"
            )
        else:
            self.ec2.terminate_instances(InstanceIds=[instance_id])
            fate = "terminated it"
        serving = [i["InstanceId"] for i in instances if i["InstanceId"] != instance_id]
        still = f"; {', '.join(serving)} keeps serving" if serving else "; nothing serves yet"
        raise DeployError(
            f"new instance {instance_id} (release {ref.id}) failed its health check: "
            f"{problem}; {fate}{still}"
        )

    def tags(self, *extra: TagTypeDef) -> list[TagTypeDef]:
        """The stack tags plus a console ``Name``."""
        name: TagTypeDef = {"Key": "Name", "Value": self.config.security_group_name}
        return [*self.config.tags(), name, *extra]

    def parameters(self) -> tuple[list[str], list[str]]:
        """Store the configured secrets; keep the others. Return (names changed, names kept)."""
        config, ssm = self.config, self.ssm
        wanted = {f"{config.parameter_path}/{k}": v for k, v in config.secrets.items()}
        names, current = sorted(wanted), dict[str, tuple[str, str]]()
        for i in range(0, len(names), 10):  # GetParameters takes at most 10 names
            found = ssm.get_parameters(Names=names[i : i + 10], WithDecryption=True)
            current.update({p["Name"]: (p["Type"], p["Value"]) for p in found["Parameters"]})
        changed: list[str] = []
        for name in names:
            if current.get(name) == ("SecureString", wanted[name]):
                continue
            exists = name in current
            self.progress(f"{'Updating' if exists else 'Creating'} SSM parameter {name}")
            # SSM refuses Tags together with Overwrite: tag on create only.
            tagged = {"Tags": [{"Key": t["Key"], "Value": t["Value"]} for t in config.tags()]}
            extra: dict[str, Any] = {"Overwrite": True} if exists else tagged
            try:
                ssm.put_parameter(
                    Name=name,
                    Value=wanted[name],
                    Type="SecureString",
                    **extra,
                    Tier="Intelligent-Tiering",
                    Description="Prism origin secret",
                )
            except ClientError as error:
                # Raised afresh: the original's request context holds the value.
                raise DeployError(f"could not store SSM parameter {name}: {_code(error)}") from None
            changed.append(name)
        removed = {f"{config.parameter_path}/{n}" for n in config.remove_secrets}
        kept: list[str] = []
        pages = ssm.get_paginator("get_parameters_by_path").paginate(Path=config.parameter_path)
        for stored in sorted(p["Name"] for page in pages for p in page["Parameters"]):
            if stored in wanted:
                continue
            if stored in removed:
                self.progress(f"Deleting SSM parameter {stored} (--remove-secret)")
                ssm.delete_parameter(Name=stored)
                changed.append(stored)
            else:
                # A re-deploy without a secret in its environment never drops it.
                self.progress(f"Keeping stored SSM parameter {stored} (not set in this deploy)")
                kept.append(stored)
        if not changed:
            self.progress(f"SSM parameters under {config.parameter_path} are up to date")
        return changed, kept

    def elastic_ip(self) -> tuple[str, str]:
        """The stack's Elastic IP (allocation id, address), allocated once."""
        found = self.ec2.describe_addresses(Filters=self.filters())["Addresses"]
        if found:
            self.progress(f"Reusing Elastic IP {found[0]['PublicIp']}")
            return found[0]["AllocationId"], found[0]["PublicIp"]
        self.progress("Allocating an Elastic IP")
        spec: TagSpecificationTypeDef = {"ResourceType": "elastic-ip", "Tags": self.tags()}
        address = self.ec2.allocate_address(Domain="vpc", TagSpecifications=[spec])
        return address["AllocationId"], address["PublicIp"]

    def filters(self) -> list[FilterTypeDef]:
        return [{"Name": f"tag:{t['Key']}", "Values": [t["Value"]]} for t in self.config.tags()]

    def instances(self) -> list[InstanceTypeDef]:
        """The stack's live instances, oldest first."""
        states: FilterTypeDef = {"Name": "instance-state-name", "Values": _LIVE_STATES}
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[*self.filters(), states]
        )
        found = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        return sorted(found, key=lambda i: i["LaunchTime"])

    def wait(
        self, waiter: Literal["instance_running", "instance_stopped"], instance_id: str
    ) -> None:
        try:
            self.ec2.get_waiter(waiter).wait(
                InstanceIds=[instance_id], WaiterConfig={"Delay": 5, "MaxAttempts": 60}
            )
        except WaiterError as error:
            raise DeployError(f"instance {instance_id}: {waiter} timed out ({error})") from None

    def refresh(self, instance: InstanceTypeDef, *, secrets_changed: bool) -> bool:
        """Bring a current instance up with the current secrets; True if it (re)started."""
        instance_id, state = instance["InstanceId"], instance["State"]["Name"]
        self.progress(f"Updating instance {instance_id} ({state})")
        if state in ("stopping", "stopped"):
            self.wait("instance_stopped", instance_id)
            self.progress(f"Starting {instance_id}")
            self.ec2.start_instances(InstanceIds=[instance_id])
            return True
        if secrets_changed:
            # A reboot re-runs the unit's ExecStartPre, which refetches the parameters.
            self.wait("instance_running", instance_id)
            self.progress(f"Rebooting {instance_id} to load the new secrets")
            self.ec2.reboot_instances(InstanceIds=[instance_id])
            return True
        return False

    def resolve_ami(self) -> str:
        """The current Ubuntu 24.04 LTS AMI, from Canonical's SSM public parameter."""
        candidates = ami_parameters(self.config.instance_type)
        found = self.ssm.get_parameters(Names=list(candidates))["Parameters"]
        values = {p["Name"]: p["Value"] for p in found}
        for name in candidates:
            if name in values:
                self.progress(f"Using AMI {values[name]} from {name}")
                return values[name]
        raise DeployError(f"no Ubuntu 24.04 AMI found via SSM in {self.config.region}; pass --ami")

    def launch(
        self,
        ami: str,
        group_id: str,
        profile: str,
        user_data: str,
        launch: str,
        ref: ReleaseRef,
        *,
        retry: bool,
    ) -> str:
        config = self.config
        self.progress(f"Launching {config.instance_type} instance from {ami} ({ref.image})")
        identity: list[TagTypeDef] = [
            {"Key": _TAG_LAUNCH, "Value": launch},
            {"Key": _TAG_RELEASE, "Value": ref.id},
            {"Key": "prism:image", "Value": ref.image},
            {"Key": "prism:python", "Value": ref.python},
        ]
        specs: list[TagSpecificationTypeDef] = [
            {"ResourceType": "instance", "Tags": self.tags(*identity)},
            {"ResourceType": "volume", "Tags": self.tags()},
        ]
        attempts = 8 if retry else 1
        for attempt in range(1, attempts + 1):
            try:
                return self.ec2.run_instances(
                    ImageId=ami,
                    InstanceType=cast("InstanceTypeType", config.instance_type),
                    MinCount=1,
                    MaxCount=1,
                    # A public address of its own: the health check dials it before
                    # the Elastic IP moves.
                    NetworkInterfaces=[
                        {
                            "DeviceIndex": 0,
                            "AssociatePublicIpAddress": True,
                            "Groups": [group_id],
                        }
                    ],
                    IamInstanceProfile={"Name": profile},
                    UserData=user_data,
                    MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
                    TagSpecifications=specs,
                )["Instances"][0]["InstanceId"]
            except ClientError as error:
                # A new instance profile takes a few seconds to become usable by EC2.
                if "iamInstanceProfile" not in str(error) or attempt == attempts:
                    raise
                self.progress("Waiting for the new instance profile to propagate")
                self.sleep(2.0 * attempt)
        raise AssertionError("unreachable")

    def associate(self, allocation_id: str, instance_id: str) -> None:
        address = self.ec2.describe_addresses(AllocationIds=[allocation_id])["Addresses"][0]
        if address.get("InstanceId") != instance_id:
            self.progress(f"Attaching Elastic IP {address['PublicIp']} to {instance_id}")
            self.ec2.associate_address(
                AllocationId=allocation_id, InstanceId=instance_id, AllowReassociation=True
            )
