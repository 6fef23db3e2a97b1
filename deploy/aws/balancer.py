"""The load balancer in front of a fleet (``--instances`` > 1): a Network Load Balancer on
443 and the target group the Auto Scaling group registers its instances in.

With ``--domain`` the listener is TLS with an ACM certificate for the domain (DNS
validated) and re-encrypts to Caddy on each instance; without one it passes TCP through
to Caddy's self-signed certificate, as a single instance without a domain does. Why not
TCP passthrough to Caddy's ACME certificate: each instance would order its own, and the
CA's validation connections land on whichever instance the load balancer picks, so an
order would rarely pass (docs/deploying.md).

Mixed into :class:`deploy.aws.deployer.Deployer` like the other step groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from deploy.aws.stack import DeployError, OriginDeployConfig, Progress
from prism.routes import HEALTH_PATH

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client

__all__ = ["HEALTH_CHECK", "TLS_POLICY", "BalancerSteps"]

# TLS 1.3 and 1.2 with forward secrecy only; what the edge (Cloudflare) speaks.
TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
#: The target group's health check: Caddy's catch-all site proxies it to the origin,
#: whose /healthz is a 503 while its loop lags (and Caddy's is while it is down).
HEALTH_CHECK: dict[str, Any] = {
    "HealthCheckProtocol": "HTTPS",
    "HealthCheckPort": "traffic-port",
    "HealthCheckPath": HEALTH_PATH,
    "HealthCheckEnabled": True,
    "HealthCheckIntervalSeconds": 10,
    "HealthCheckTimeoutSeconds": 5,
    "HealthyThresholdCount": 3,
    "UnhealthyThresholdCount": 3,
    "Matcher": {"HttpCode": "200"},
}
_PORT = 443


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class BalancerSteps:
    """Mixed into the deployer, which provides these attributes."""

    config: OriginDeployConfig
    progress: Progress
    ec2: EC2Client
    # No ELBv2/ACM stubs are installed; these stay untyped.
    elbv2: Any
    acm: Any

    def subnets(self) -> tuple[str, list[str]]:
        """The default VPC and its default subnets (one per availability zone)."""
        vpcs = self.ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            region = self.config.region
            raise DeployError(f"no default VPC in {region} (aws ec2 create-default-vpc)")
        vpc_id = vpcs[0]["VpcId"]
        found = self.ec2.describe_subnets(
            Filters=[
                {"Name": "vpc-id", "Values": [vpc_id]},
                {"Name": "default-for-az", "Values": ["true"]},
            ]
        )["Subnets"]
        subnets = sorted(s["SubnetId"] for s in found)
        if not subnets:
            raise DeployError(f"the default VPC {vpc_id} has no default subnets")
        return vpc_id, subnets

    def elb_tags(self) -> list[dict[str, str]]:
        return [{"Key": t["Key"], "Value": t["Value"]} for t in self.config.tags()]

    def certificate(self) -> str:
        """The issued ACM certificate for the domain (requested once); raises with the
        DNS record to add while ACM waits for it."""
        domain = self.config.domain
        assert domain is not None
        pages = self.acm.get_paginator("list_certificates").paginate(
            CertificateStatuses=["PENDING_VALIDATION", "ISSUED"]
        )
        arn = next(
            (
                c["CertificateArn"]
                for page in pages
                for c in page["CertificateSummaryList"]
                if c["DomainName"] == domain and self._ours(c["CertificateArn"])
            ),
            None,
        )
        if arn is None:
            self.progress(f"Requesting an ACM certificate for {domain} (DNS validation)")
            arn = self.acm.request_certificate(
                DomainName=domain,
                ValidationMethod="DNS",
                # Alphanumeric only; a retried request within the hour is the same one.
                IdempotencyToken=f"prism{self.config.name.replace('-', '')}"[:32],
                Tags=self.elb_tags(),
            )["CertificateArn"]
        described = self.acm.describe_certificate(CertificateArn=arn)["Certificate"]
        if described["Status"] == "ISSUED":
            self.progress(f"Using ACM certificate {arn} for {domain}")
            return str(arn)
        records = [
            o["ResourceRecord"]
            for o in described.get("DomainValidationOptions", [])
            if "ResourceRecord" in o
        ]
        add = "; ".join(f"{r['Type']} {r['Name']} -> {r['Value']}" for r in records)
        raise DeployError(
            f"the ACM certificate for {domain} awaits DNS validation: add "
            f"{add or 'the record shown by aws acm describe-certificate'}, then run this "
            f"deploy again ({arn})"
        )

    def _ours(self, arn: str) -> bool:
        tags = self.acm.list_tags_for_certificate(CertificateArn=arn).get("Tags", [])
        wanted = {(t["Key"], t["Value"]) for t in self.elb_tags()}
        return wanted <= {(t["Key"], t.get("Value", "")) for t in tags}

    def target_group(self, vpc_id: str) -> str:
        """The instances' target group (TLS behind a TLS listener, else TCP), by name."""
        protocol = "TLS" if self.config.domain else "TCP"
        name = self.config.elb_name(protocol.lower())
        try:
            [group] = self.elbv2.describe_target_groups(Names=[name])["TargetGroups"]
        except ClientError as error:
            if _code(error) != "TargetGroupNotFound":
                raise
        else:
            self.progress(f"Reusing target group {name}")
            current = {k: group.get(k) for k in HEALTH_CHECK}
            if current != HEALTH_CHECK:
                self.progress(f"Setting the health check of {name} to HTTPS {HEALTH_PATH}")
                self.elbv2.modify_target_group(
                    TargetGroupArn=group["TargetGroupArn"], **HEALTH_CHECK
                )
            return str(group["TargetGroupArn"])
        self.progress(f"Creating target group {name} ({protocol}:{_PORT}, HTTPS {HEALTH_PATH})")
        created = self.elbv2.create_target_group(
            Name=name,
            Protocol=protocol,
            Port=_PORT,
            VpcId=vpc_id,
            TargetType="instance",
            Tags=self.elb_tags(),
            **HEALTH_CHECK,
        )
        return str(created["TargetGroups"][0]["TargetGroupArn"])

    def load_balancer(self, subnets: list[str]) -> tuple[str, str]:
        """The internet-facing NLB (arn, DNS name), by name."""
        name = self.config.elb_name("nlb")
        try:
            [found] = self.elbv2.describe_load_balancers(Names=[name])["LoadBalancers"]
        except ClientError as error:
            if _code(error) != "LoadBalancerNotFound":
                raise
        else:
            self.progress(f"Reusing load balancer {name} ({found['DNSName']})")
            return str(found["LoadBalancerArn"]), str(found["DNSName"])
        self.progress(f"Creating network load balancer {name} in {len(subnets)} zones")
        created = self.elbv2.create_load_balancer(
            Name=name,
            Subnets=subnets,
            Scheme="internet-facing",
            Type="network",
            IpAddressType="ipv4",
            Tags=self.elb_tags(),
        )["LoadBalancers"][0]
        arn = str(created["LoadBalancerArn"])
        # An uneven count of instances over the zones still shares the load evenly.
        self.elbv2.modify_load_balancer_attributes(
            LoadBalancerArn=arn,
            Attributes=[{"Key": "load_balancing.cross_zone.enabled", "Value": "true"}],
        )
        return arn, str(created["DNSName"])

    def listener(self, balancer: str, target_group: str, certificate: str | None) -> bool:
        """Port 443 forwarding to the target group; True if it was created or changed."""
        wanted: dict[str, Any] = {
            "Protocol": "TLS" if certificate else "TCP",
            "Port": _PORT,
            "DefaultActions": [{"Type": "forward", "TargetGroupArn": target_group}],
        }
        if certificate:
            wanted["Certificates"] = [{"CertificateArn": certificate}]
            wanted["SslPolicy"] = TLS_POLICY
        listeners = self.elbv2.describe_listeners(LoadBalancerArn=balancer)["Listeners"]
        current = next((x for x in listeners if x["Port"] == _PORT), None)
        if current is None:
            self.progress(f"Creating the {wanted['Protocol']}:{_PORT} listener")
            self.elbv2.create_listener(LoadBalancerArn=balancer, Tags=self.elb_tags(), **wanted)
            return True
        forwards = [a.get("TargetGroupArn") for a in current.get("DefaultActions", [])]
        same = (
            current["Protocol"] == wanted["Protocol"]
            and forwards == [target_group]
            and [c["CertificateArn"] for c in current.get("Certificates", [])]
            == [c["CertificateArn"] for c in wanted.get("Certificates", [])]
        )
        if same:
            return False
        self.progress(f"Updating the {_PORT} listener ({wanted['Protocol']})")
        self.elbv2.modify_listener(ListenerArn=current["ListenerArn"], **wanted)
        return True
