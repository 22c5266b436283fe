"""The controller: reconcile pass, pure decisions, the executor, the loop and its daemon."""
