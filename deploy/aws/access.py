"""The access steps of ``prism deploy origin``: the HTTPS-only security group and the
instance role (read the stack's parameters and releases, write its request log's files,
Session Manager; nothing else)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from deploy.aws.stack import DeployError, OriginDeployConfig, Progress

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.type_defs import (
        IpPermissionTypeDef,
        TagSpecificationTypeDef,
        TagTypeDef,
    )

__all__ = ["AccessSteps"]

# Session Manager (a shell without an SSH port): the agent's part of the AWS-managed
# AmazonSSMManagedInstanceCore, without its read access to every parameter.
_SESSION_MANAGER = {
    "Sid": "SessionManager",
    "Effect": "Allow",
    "Resource": "*",
    "Action": [
        "ssm:UpdateInstanceInformation",
        "ssmmessages:CreateControlChannel",
        "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel",
        "ec2messages:AcknowledgeMessage",
        "ec2messages:DeleteMessage",
        "ec2messages:FailMessage",
        "ec2messages:GetEndpoint",
        "ec2messages:GetMessages",
        "ec2messages:SendReply",
    ],
}
_HTTPS_RULES = frozenset(
    {("tcp", 443, 443, "cidr", "0.0.0.0/0"), ("tcp", 443, 443, "cidr6", "::/0")}
)


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


class AccessSteps:
    """Mixed into the deployer, which provides these attributes."""

    config: OriginDeployConfig
    progress: Progress
    ec2: EC2Client
    iam: Any

    def tags(self, *extra: TagTypeDef) -> list[TagTypeDef]:
        raise NotImplementedError

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

    def instance_profile(self, *, partition: str, account: str, bucket: str) -> tuple[str, bool]:
        """Role + profile that may read only the stack's parameters and releases, put its
        request log's files, plus Session Manager; (name, newly usable)."""
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
        releases = {
            "Sid": "ReadOriginReleases",
            "Effect": "Allow",
            "Resource": f"arn:{partition}:s3:::{bucket}/{config.release_prefix}releases/*",
            "Action": "s3:GetObject",
        }
        request_log = {
            "Sid": "WriteRequestLog",
            "Effect": "Allow",
            "Resource": f"arn:{partition}:s3:::{bucket}/{config.request_log_prefix}*",
            "Action": "s3:PutObject",
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
        iam.put_role_policy(
            RoleName=name,
            PolicyName="prism-origin-read-releases",
            PolicyDocument=_policy(releases),
        )
        iam.put_role_policy(
            RoleName=name,
            PolicyName="prism-origin-write-request-log",
            PolicyDocument=_policy(request_log),
        )
        iam.put_role_policy(
            RoleName=name,
            PolicyName="prism-origin-session-manager",
            PolicyDocument=_policy(_SESSION_MANAGER),
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
            if error.response.get("Error", {}).get("Code") != "NoSuchEntity":
                raise
            return None


def _policy(statement: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})
