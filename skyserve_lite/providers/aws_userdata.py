"""EC2's part of the boot script (``boot_script``): its replica id from the launch index, S3 copies, secrets.

An EC2 instance finds which of its batch's replica ids it is from its position in the ``RunInstances`` call
(``ami-launch-index`` from the metadata service, IMDSv2), and copies its snapshot and ``s3://`` sources and
reads its secrets from Secrets Manager with the AWS CLI under the instance's own role. A secret's reference
is its ARN, which says the region to ask. Ubuntu's AMIs (the default image) lack the CLI: the script installs
it from snap when it needs it and finds none. The whole script is the instance's user data, which EC2 limits
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
    # The secret's value is stored as SecretBinary, which the CLI prints in base64: every byte comes through.
    read_secret='local region=${1#arn:*:secretsmanager:}; aws secretsmanager get-secret-value '
                '--region "${region%%:*}" --secret-id "$1" --query SecretBinary --output text',
    prepare=("command -v aws >/dev/null || snap install aws-cli --classic >/dev/null || "
             "fail \"this image has no AWS CLI, and snap cannot install it\"",),
)


def render_user_data(batch: BootBatch, fetches: Sequence[Fetch] = (), files: StagedFiles | None = None) -> str:
    """The cloud-init script of one EC2 launch batch."""
    return render_boot_script(AWS_BOOT, batch, fetches, files)
