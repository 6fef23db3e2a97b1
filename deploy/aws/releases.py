"""The region's release bucket: releases, cached locks and each stack's release history.

Layout in ``prism-releases-<account>-<region>`` (private, one per account and
region, shared by the region's stacks), under ``origin/<stack>/``:

- ``releases/<id>/<wheel>`` and ``releases/<id>/requirements.txt``: written once
  (content-addressed), read by the instance with its role.
- ``locks/<key>.txt``: the lock for a set of dependencies and a target, reused so
  an unchanged checkout is the same release.
- ``history.json``: the releases that served, newest last (for ``--rollback``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from deploy.aws.stack import DeployError, Progress, ReleaseRef
from deploy.release import Release

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["ReleaseStore", "bucket_name"]

_HISTORY_LIMIT = 20


def bucket_name(account: str, region: str) -> str:
    return f"prism-releases-{account}-{region}"


def _missing(error: ClientError) -> bool:
    code = str(error.response.get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket")


class ReleaseStore:
    """One stack's view of the bucket."""

    def __init__(self, s3: S3Client, bucket: str, prefix: str, progress: Progress) -> None:
        self.s3, self.bucket, self.prefix, self.progress = s3, bucket, prefix, progress

    def ensure_bucket(self, region: str, tags: list[dict[str, str]]) -> None:
        try:
            self.s3.head_bucket(Bucket=self.bucket)
            return
        except ClientError as error:
            if not _missing(error):
                raise DeployError(f"cannot use S3 bucket {self.bucket}: {error}") from None
        self.progress(f"Creating S3 bucket {self.bucket}")
        extra: dict[str, Any] = {}
        if region != "us-east-1":  # the one region that refuses a LocationConstraint
            extra["CreateBucketConfiguration"] = {"LocationConstraint": region}
        self.s3.create_bucket(Bucket=self.bucket, **extra)
        self.s3.put_public_access_block(
            Bucket=self.bucket,
            PublicAccessBlockConfiguration={
                "BlockPublicAcls": True,
                "IgnorePublicAcls": True,
                "BlockPublicPolicy": True,
                "RestrictPublicBuckets": True,
            },
        )
        self.s3.put_bucket_tagging(Bucket=self.bucket, Tagging={"TagSet": tags})  # type: ignore[typeddict-item]

    def release_key(self, release_id: str, name: str) -> str:
        return f"{self.prefix}releases/{release_id}/{name}"

    def _get(self, key: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as error:
            if _missing(error):
                return None
            raise

    def _exists(self, key: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as error:
            if _missing(error):
                return False
            raise

    def lock(self, key: str) -> str | None:
        data = self._get(f"{self.prefix}locks/{key}.txt")
        return data.decode() if data is not None else None

    def store_lock(self, key: str, text: str) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=f"{self.prefix}locks/{key}.txt", Body=text)

    def store(self, release: Release) -> bool:
        """Upload the release's objects unless stored; True if anything was uploaded."""
        objects = {
            release.wheel_name: release.wheel,
            "requirements.txt": release.requirements.encode(),
        }
        uploaded = False
        for name, body in objects.items():
            key = self.release_key(release.id, name)
            if self._exists(key):
                continue
            self.progress(f"Uploading s3://{self.bucket}/{key}")
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)
            uploaded = True
        return uploaded

    def stored(self, ref: ReleaseRef) -> bool:
        return all(self._exists(self.release_key(ref.id, name)) for name in ref.files)

    def history(self) -> list[ReleaseRef]:
        data = self._get(f"{self.prefix}history.json")
        if data is None:
            return []
        return [ReleaseRef.from_dict(entry) for entry in json.loads(data)["releases"]]

    def record(self, ref: ReleaseRef) -> None:
        """Note that ``ref`` now serves (moved to the end if it served before)."""
        entries = [r for r in self.history() if r.id != ref.id] + [ref]
        body = json.dumps({"releases": [r.to_dict() for r in entries[-_HISTORY_LIMIT:]]})
        self.s3.put_object(Bucket=self.bucket, Key=f"{self.prefix}history.json", Body=body)
