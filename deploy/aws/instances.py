"""The blue/green instance swap of ``prism deploy origin``: find the stack's instances and
the one its Elastic IP serves, bring up a healthy instance of the release (resumed, or
launched when the launch spec changed), and move the address to it.

Mixed into :class:`deploy.aws.deployer.Deployer` as :class:`deploy.aws.access.AccessSteps`
is, apart from it because the swap is a concern of its own: an instance's identity is
its launch-spec hash (``TAG_LAUNCH``), and the serving one is replaced only by one that
passed its health check.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, cast

from botocore.exceptions import ClientError, WaiterError

from deploy.aws.stack import DeployError, HealthCheck, OriginDeployConfig, Progress, ReleaseRef
from deploy.aws.userdata import IMAGE, ami_parameters

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.literals import InstanceTypeType
    from mypy_boto3_ec2.type_defs import (
        FilterTypeDef,
        InstanceTypeDef,
        TagSpecificationTypeDef,
        TagTypeDef,
    )
    from mypy_boto3_ssm import SSMClient

__all__ = ["TAG_LAUNCH", "TAG_RELEASE", "InstanceSteps", "instance_tag", "launch_hash"]

TAG_LAUNCH = "prism:launch"  # hash of the launch spec; a new hash means a new instance
TAG_RELEASE = "prism:release"  # the release id the instance runs
_LIVE_STATES = ["pending", "running", "stopping", "stopped"]


def instance_tag(instance: InstanceTypeDef, key: str) -> str | None:
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == key), None)


def launch_hash(config: OriginDeployConfig, user_data: str) -> str:
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


class InstanceSteps:
    """Mixed into the deployer, which provides these attributes."""

    config: OriginDeployConfig
    progress: Progress
    sleep: Callable[[float], None]
    health_check: HealthCheck
    keep_failed: bool
    ec2: EC2Client
    ssm: SSMClient

    def tags(self, *extra: TagTypeDef) -> list[TagTypeDef]:
        raise NotImplementedError

    def filters(self) -> list[FilterTypeDef]:
        raise NotImplementedError

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
        waiting = [i for i in instances if instance_tag(i, TAG_LAUNCH) == launch]
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
            {"Key": TAG_LAUNCH, "Value": launch},
            {"Key": TAG_RELEASE, "Value": ref.id},
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
