"""The control verbs, each defined once against a small port of the job: options, plan, apply, rendering."""
