"""kopf handlers (the only module that imports kopf): filled in by the runtime issue."""
