"""Task and service spec: parsing (``parse``), validation, typed values (``model``) and the replica-config
comparison (``config``).

Nothing is imported here: each caller imports the module it uses, so that reading a version's spec
(``parse``, ``model``) does not load the file manifests and hashing that only comparing configs needs.
"""
