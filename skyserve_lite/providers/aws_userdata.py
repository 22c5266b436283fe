"""EC2's part of the boot script (``boot_script``): its replica id from the launch index, S3 copies.

An EC2 instance finds which of its batch's replica ids it is from its position in the ``RunInstances`` call
(``ami-launch-index`` from the metadata service, IMDSv2), and copies its snapshot and ``s3://`` sources with
the AWS CLI under the instance's own role. The whole script is the instance's user data, which EC2 limits
to 16 KB.
"""

from __future__ import annotations

from collections.abc import Sequence

from skyserve_lite.providers.boot_script import BootBatch, BootCloud, Fetch, StagedFiles, render_boot_script

# EC2 refuses user data above 16 KB (before its base64 encoding).
USER_DATA_LIMIT_BYTES = 16 * 1024

AWS_BOOT = BootCloud(
    name="aws",
    find_replica_id=(
        "imds=http://169.254.169.254/latest",
        "imds_token=$(curl -fsS -X PUT \"$imds/api/token\" -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')",
        "launch_index=$(curl -fsS -H \"X-aws-ec2-metadata-token: $imds_token\" "
        "\"$imds/meta-data/ami-launch-index\")",
        "replica_id=$(echo \"$replica_ids\" | cut -d, -f\"$((launch_index + 1))\")",
    ),
    copy_object='aws s3 cp --only-show-errors "$1" "$2"',
    copy_tree='aws s3 cp --recursive --only-show-errors "$1" "$2"',
)


def render_user_data(batch: BootBatch, fetches: Sequence[Fetch] = (), files: StagedFiles | None = None) -> str:
    """The cloud-init script of one EC2 launch batch."""
    return render_boot_script(AWS_BOOT, batch, fetches, files)
