"""What a version's replicas run besides its YAML: its `workdir` and `file_mounts`, captured when the task
is submitted into a content-addressed snapshot (``manifest``: the values; ``ignore``: `.skyignore` and
`.gitignore`; ``blobs``: the store; ``capture``: reading a task's files into it)."""
