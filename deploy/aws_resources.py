"""The AWS steps of ``prism deploy origin``, one per resource, run in order by ``Deployer``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, cast

from botocore.exceptions import ClientError, WaiterError

from deploy.aws_origin import (
    Action,
    DeployError,
    DeployResult,
    OriginDeployConfig,
    Progress,
)
from deploy.aws_userdata import ami_parameters

if TYPE_CHECKING:
    import boto3
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.literals import InstanceTypeType
    from mypy_boto3_ec2.type_defs import (
        FilterTypeDef,
        InstanceTypeDef,
        IpPermissionTypeDef,
        TagSpecificationTypeDef,
        TagTypeDef,
    )
    from mypy_boto3_ssm import SSMClient

__all__ = ["Deployer"]

_TAG_LAUNCH = "prism:launch"  # hash of the launch spec; a new hash means replace
_LIVE_STATES = ["pending", "running", "stopping", "stopped"]
_HTTPS_RULES = frozenset(
    {("tcp", 443, 443, "cidr", "0.0.0.0/0"), ("tcp", 443, 443, "cidr6", "::/0")}
)


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", "Unknown"))


def _tag(instance: InstanceTypeDef, key: str) -> str | None:
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == key), None)


def _launch_hash(config: OriginDeployConfig, user_data: str) -> str:
    # The looked-up "latest" AMI is left out on purpose: a new Debian build
    # alone should not replace a healthy instance.
    spec = {"user_data": user_data, "type": config.instance_type, "ami": config.ami or "latest"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


_Rule = tuple[str, int, int, str, str]


def _rules(permissions: list[Any]) -> Iterator[_Rule]:
    """Flatten ingress permissions to one (proto, from, to, kind, source) per source."""
    for p in permissions:
        head = (p["IpProtocol"], p.get("FromPort", -1), p.get("ToPort", -1))
        yield from ((*head, "cidr", r["CidrIp"]) for r in p.get("IpRanges", []))
        yield from ((*head, "cidr6", r["CidrIpv6"]) for r in p.get("Ipv6Ranges", []))
        yield from ((*head, "group", g["GroupId"]) for g in p.get("UserIdGroupPairs", []))
        yield from ((*head, "prefix", x["PrefixListId"]) for x in p.get("PrefixListIds", []))


def _permission(rule: _Rule) -> IpPermissionTypeDef:
    proto, low, high, kind, source = rule
    perm: IpPermissionTypeDef = {"IpProtocol": proto}
    if proto != "-1":
        perm["FromPort"], perm["ToPort"] = low, high
    if kind == "cidr":
        perm["IpRanges"] = [{"CidrIp": source, "Description": "HTTPS"}]
    elif kind == "cidr6":
        perm["Ipv6Ranges"] = [{"CidrIpv6": source, "Description": "HTTPS"}]
    elif kind == "group":
        perm["UserIdGroupPairs"] = [{"GroupId": source}]
    else:
        perm["PrefixListIds"] = [{"PrefixListId": source}]
    return perm


class Deployer:
    """One ``apply`` run: the clients, the config and the progress sink, shared by the steps."""

    def __init__(
        self,
        config: OriginDeployConfig,
        session: boto3.Session,
        progress: Progress,
        sleep: Callable[[float], None],
    ) -> None:
        self.config, self.progress, self.sleep = config, progress, sleep
        self.ec2: EC2Client = session.client("ec2", region_name=config.region)
        self.ssm: SSMClient = session.client("ssm", region_name=config.region)
        # No IAM/STS stubs are installed; these two stay untyped.
        self.iam: Any = session.client("iam", region_name=config.region)
        self.sts: Any = session.client("sts", region_name=config.region)

    def run(self) -> DeployResult:
        config, progress = self.config, self.progress
        progress("Checking AWS credentials")
        arn: str = self.sts.get_caller_identity()["Arn"]
        group_id = self.security_group()
        changed = self.parameters()
        profile, profile_is_new = self.instance_profile(
            partition=arn.split(":")[1], account=arn.split(":")[4]
        )
        allocation_id, public_ip = self.elastic_ip()

        user_data = config.user_data(config.domain or public_ip)
        launch = _launch_hash(config, user_data)
        progress("Looking for an existing origin instance")
        instances = self.instances()
        current = [i for i in instances if _tag(i, _TAG_LAUNCH) == launch]
        action: Action = "updated" if current else "replaced" if instances else "created"
        restarted = False
        if current:
            instance_id = current[-1]["InstanceId"]
            restarted = self.refresh(current[-1], secrets_changed=bool(changed))
        else:
            if instances:
                progress("Launch spec changed (user-data, package, type or AMI): replacing")
            ami = config.ami or self.resolve_ami()
            instance_id = self.launch(
                ami, group_id, profile, user_data, launch, retry=profile_is_new
            )
        self.wait("instance_running", instance_id)
        self.associate(allocation_id, instance_id)
        stale = tuple(i["InstanceId"] for i in instances if i["InstanceId"] != instance_id)
        if stale:
            progress(f"Terminating previous instance(s) {', '.join(stale)}")
            self.ec2.terminate_instances(InstanceIds=list(stale))

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
            parameter_names=config.parameter_names,
            parameters_changed=tuple(changed),
            restarted=restarted,
            terminated_instance_ids=stale,
        )

    def tags(self, *extra: TagTypeDef) -> list[TagTypeDef]:
        """The stack tags plus a console ``Name``."""
        name: TagTypeDef = {"Key": "Name", "Value": self.config.security_group_name}
        return [*self.config.tags(), name, *extra]

    def security_group(self) -> str:
        """Find or create the group; leave exactly tcp/443 from anywhere open."""
        config, ec2 = self.config, self.ec2
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise DeployError(f"no default VPC in {config.region} (aws ec2 create-default-vpc)")
        name, vpc_id = config.security_group_name, vpcs[0]["VpcId"]
        groups = ec2.describe_security_groups(
            Filters=[
                {"Name": "group-name", "Values": [name]},
                {"Name": "vpc-id", "Values": [vpc_id]},
            ]
        )["SecurityGroups"]
        if groups:
            group_id, permissions = groups[0]["GroupId"], groups[0].get("IpPermissions", [])
            self.progress(f"Reusing security group {name} ({group_id})")
        else:
            self.progress(f"Creating security group {name}")
            spec: TagSpecificationTypeDef = {"ResourceType": "security-group", "Tags": self.tags()}
            group_id = ec2.create_security_group(
                GroupName=name,
                Description="Prism origin: HTTPS only",
                VpcId=vpc_id,
                TagSpecifications=[spec],
            )["GroupId"]
            permissions = []
        have = set(_rules(list(permissions)))
        if extra := have - _HTTPS_RULES:
            self.progress(f"Revoking {len(extra)} extra ingress rule(s) from {name}")
            ec2.revoke_security_group_ingress(
                GroupId=group_id, IpPermissions=[_permission(r) for r in sorted(extra)]
            )
        if missing := _HTTPS_RULES - have:
            self.progress(f"Allowing tcp/443 from anywhere in {name}")
            ec2.authorize_security_group_ingress(
                GroupId=group_id, IpPermissions=[_permission(r) for r in sorted(missing)]
            )
        return group_id

    def parameters(self) -> list[str]:
        """Make the stack's SSM path hold exactly the configured secrets; return names changed."""
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
        pages = ssm.get_paginator("get_parameters_by_path").paginate(Path=config.parameter_path)
        for stale in (p["Name"] for page in pages for p in page["Parameters"]):
            if stale not in wanted:
                self.progress(f"Deleting SSM parameter {stale} (no longer configured)")
                ssm.delete_parameter(Name=stale)
                changed.append(stale)
        if not changed:
            self.progress(f"SSM parameters under {config.parameter_path} are up to date")
        return changed

    def instance_profile(self, *, partition: str, account: str) -> tuple[str, bool]:
        """Role + profile that may read only the stack's parameters; (name, newly usable)."""
        config, iam, name = self.config, self.iam, self.config.role_name
        tags = [{"Key": t["Key"], "Value": t["Value"]} for t in config.tags()]
        base = f"arn:{partition}:ssm:{config.region}:{account}:parameter{config.parameter_path}"
        trust = {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
        read = {
            "Sid": "ReadOriginParameters",
            "Effect": "Allow",
            "Resource": [base, f"{base}/*"],
            "Action": ["ssm:GetParametersByPath", "ssm:GetParameters", "ssm:GetParameter"],
        }
        if self._exists(lambda: iam.get_role(RoleName=name)):
            self.progress(f"Reusing IAM role {name}")
        else:
            self.progress(f"Creating IAM role {name}")
            iam.create_role(
                RoleName=name,
                Tags=tags,
                Description="Prism origin",
                AssumeRolePolicyDocument=_policy(trust),
            )
        iam.put_role_policy(
            RoleName=name, PolicyName="prism-origin-read-parameters", PolicyDocument=_policy(read)
        )
        profile = self._exists(lambda: iam.get_instance_profile(InstanceProfileName=name))
        if not profile:
            self.progress(f"Creating instance profile {name}")
            iam.create_instance_profile(InstanceProfileName=name, Tags=tags)
        roles = profile["InstanceProfile"]["Roles"] if profile else []
        if any(r["RoleName"] == name for r in roles):
            return name, False
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
        return name, True

    @staticmethod
    def _exists(get: Callable[[], Any]) -> Any:
        """``get()``'s response, or None when IAM says NoSuchEntity."""
        try:
            return get()
        except ClientError as error:
            if _code(error) != "NoSuchEntity":
                raise
            return None

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
        """Latest Debian 12, else Ubuntu 24.04, from the SSM public parameters."""
        candidates = ami_parameters(self.config.instance_type)
        found = self.ssm.get_parameters(Names=list(candidates))["Parameters"]
        values = {p["Name"]: p["Value"] for p in found}
        for name in candidates:
            if name in values:
                self.progress(f"Using AMI {values[name]} from {name}")
                return values[name]
        raise DeployError(
            f"no Debian 12 or Ubuntu 24.04 AMI found via SSM in {self.config.region}; pass --ami"
        )

    def launch(
        self, ami: str, group_id: str, profile: str, user_data: str, launch: str, *, retry: bool
    ) -> str:
        config = self.config
        self.progress(f"Launching {config.instance_type} instance from {ami}")
        specs: list[TagSpecificationTypeDef] = [
            {"ResourceType": "instance", "Tags": self.tags({"Key": _TAG_LAUNCH, "Value": launch})},
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
                    SecurityGroupIds=[group_id],
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


def _policy(statement: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})
