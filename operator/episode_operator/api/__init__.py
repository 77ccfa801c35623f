"""The ``api`` layer (pure): the Episode resource's models and the CRD generated from them."""
