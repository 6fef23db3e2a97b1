"""A stand-in for Auto Scaling's instance refresh, which moto (5.x) does not implement.

It answers StartInstanceRefresh and DescribeInstanceRefreshes for every client of the
test session (a botocore ``before-call`` handler: the call never reaches moto), and plays
what AWS does with moto's real resources: a refresh whose release is healthy moves the
group to the desired launch template version and replaces its instances (moto launches
replacements from the template's default version, so that is set first); one whose
release fails the target group's health checks ends ``RollbackSuccessful`` with the
group untouched, as AutoRollback leaves it.
"""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace
from typing import Any

import boto3

from tests.fixtures.aws import MockAws

__all__ = ["InstanceRefreshes"]

_SERVICE = "auto-scaling"  # botocore's event name for the service


@dataclasses.dataclass
class InstanceRefreshes:
    aws: MockAws
    #: Releases whose instances never pass the target group's health checks.
    unhealthy: set[str] = dataclasses.field(default_factory=set)
    #: StartInstanceRefresh's parameters, as the deployer sent them.
    started: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: How many DescribeInstanceRefreshes answers a refresh is InProgress before it ends.
    polls_in_progress: int = 1
    _refreshes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    _pending: dict[str, Any] = dataclasses.field(default_factory=dict)
    _ids: itertools.count[int] = dataclasses.field(default_factory=lambda: itertools.count(1))
    _params: dict[str, Any] = dataclasses.field(default_factory=dict)

    def _handlers(self) -> list[tuple[str, Any, str]]:
        # Parameters are taken before serialisation; the answer replaces the call.
        return [
            (f"{stage}.{_SERVICE}.{operation}", handler, f"prism-test-{stage}-{operation}")
            for operation, answer in (
                ("StartInstanceRefresh", self._start),
                ("DescribeInstanceRefreshes", self._describe),
            )
            for stage, handler in (
                ("before-parameter-build", self._capture),
                ("before-call", answer),
            )
        ]

    def install(self, session: boto3.Session) -> None:
        for event, handler, unique_id in self._handlers():
            session.events.register(event, handler, unique_id=unique_id)

    def uninstall(self, session: boto3.Session) -> None:
        for event, _, unique_id in self._handlers():
            session.events.unregister(event, unique_id=unique_id)

    def _capture(self, params: dict[str, Any], **_: Any) -> None:
        self._params = dict(params)

    def _start(self, **_: Any) -> tuple[Any, dict[str, Any]]:
        params, self._params = self._params, {}
        self.started.append(params)
        name = params["AutoScalingGroupName"]
        template = params["DesiredConfiguration"]["LaunchTemplate"]
        version = template["Version"]
        release = self.release_of(template["LaunchTemplateName"], version)
        refresh_id = f"refresh-{next(self._ids)}"
        if release in self.unhealthy:
            status = "RollbackSuccessful"
            reason = "Instances failed to pass their ELB health checks; rolled back"
        else:
            self._replace(name, template["LaunchTemplateName"], version)
            status, reason = "Successful", ""
        self._refreshes.append(
            {
                "InstanceRefreshId": refresh_id,
                "AutoScalingGroupName": name,
                "Status": status,
                "StatusReason": reason,
                "PercentageComplete": 100,
                "Preferences": params.get("Preferences", {}),
                "DesiredConfiguration": params["DesiredConfiguration"],
                "_polls": self.polls_in_progress,
            }
        )
        return SimpleNamespace(status_code=200), {"InstanceRefreshId": refresh_id}

    def _describe(self, **_: Any) -> tuple[Any, dict[str, Any]]:
        params, self._params = self._params, {}
        ids = params.get("InstanceRefreshIds")
        answers = []
        for refresh in self._refreshes:
            if refresh["AutoScalingGroupName"] != params["AutoScalingGroupName"] or (
                ids and refresh["InstanceRefreshId"] not in ids
            ):
                continue
            shown = {k: v for k, v in refresh.items() if not k.startswith("_")}
            if refresh["_polls"] > 0:
                refresh["_polls"] -= 1
                shown.update(Status="InProgress", StatusReason="", PercentageComplete=50)
            answers.append(shown)
        return SimpleNamespace(status_code=200), {"InstanceRefreshes": answers[::-1]}

    def release_of(self, template: str, version: str) -> str:
        """The release a template version's instances are tagged with."""
        ec2 = self.aws.client("ec2")
        [found] = ec2.describe_launch_template_versions(
            LaunchTemplateName=template, Versions=[version]
        )["LaunchTemplateVersions"]
        [spec] = [
            s
            for s in found["LaunchTemplateData"]["TagSpecifications"]
            if s["ResourceType"] == "instance"
        ]
        return next(t["Value"] for t in spec["Tags"] if t["Key"] == "prism:release")

    def _replace(self, group: str, template: str, version: str) -> None:
        self._decode_user_data(template)
        ec2, autoscaling = self.aws.client("ec2"), self.aws.client("autoscaling")
        ec2.modify_launch_template(LaunchTemplateName=template, DefaultVersion=version)
        [described] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])[
            "AutoScalingGroups"
        ]
        autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=group,
            LaunchTemplate={"LaunchTemplateName": template, "Version": version},
        )
        for instance in described["Instances"]:
            autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=instance["InstanceId"], ShouldDecrementDesiredCapacity=False
            )

    def _decode_user_data(self, template: str) -> None:
        """moto keeps CreateLaunchTemplateVersion's user-data as the string it got (only
        CreateLaunchTemplate parses it) and then fails to launch from that version."""
        from moto.core.types import Base64EncodedString
        from moto.ec2.models import ec2_backends
        from moto.ec2.utils import parse_user_data

        backend = ec2_backends[self.aws.account_id][self.aws.region]
        for version in backend.get_launch_template_by_name(template).versions:
            user_data = version.data.get("UserData")
            if user_data is not None and not isinstance(user_data, Base64EncodedString):
                version.data["UserData"] = parse_user_data(user_data)
