"""Least privilege, checked: kube/rbac.py against the calls the code makes and kopf's watches.

``kube/client.py`` is read with ``ast``: every Kubernetes API method a ``KubeClient`` method
calls (``self.core.*``, ``self.custom.*``, ``self.core_ws.*``, ``extensions.*``, and the raw
service-proxy ``call_api``) maps to (apiGroup, resource, verb). The operator's code (everything
but ``cli/``) reaches some ``KubeClient`` methods; those calls plus kopf's needs must be exactly
the declared operator permissions, and the CLI's calls exactly the declared user permissions.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import episode_operator
import episode_operator.kube.client as client_module
from episode_operator.api.episode_resource import PLURAL
from episode_operator.api.episodeset_resource import SET_PLURAL
from episode_operator.api.vocabulary import GROUP
from episode_operator.kube import rbac
from episode_operator.runtime import data_api_server as served

PACKAGE = Path(episode_operator.__file__).parent
CLIENT = PACKAGE / "kube" / "client.py"
Grant = tuple[str, str, str]

# Verbs of the generated clients' method prefixes (connect_get: a websocket GET; newer API servers
# authorize exec as create, so both are granted).
VERB_PREFIXES = {
    "read": ("get",),
    "get": ("get",),
    "list": ("list",),
    "create": ("create",),
    "replace": ("update",),
    "patch": ("patch",),
    "delete": ("delete",),
    "delete_collection": ("deletecollection",),
    "connect_get": ("get", "create"),
    "connect_post": ("create",),
}
# snake_case kinds of CoreV1Api method names -> (apiGroup, resource)
CORE_KINDS = {
    "pod": ("", "pods"),
    "config_map": ("", "configmaps"),
    "event": ("", "events"),
    "service": ("", "services"),
    "secret": ("", "secrets"),
    "namespace": ("", "namespaces"),
    "custom_object": ("(group argument)", "(plural argument)"),  # resolved from the call's arguments
    "custom_resource_definition": ("apiextensions.k8s.io", "customresourcedefinitions"),
    "network_policy": ("networking.k8s.io", "networkpolicies"),
    "subject_access_review": ("authorization.k8s.io", "subjectaccessreviews"),
    "api_service": ("apiregistration.k8s.io", "apiservices"),
    "role": ("rbac.authorization.k8s.io", "roles"),  # read_cluster_role: clusterroles (below)
    "job": ("batch", "jobs"),
    "daemon_set": ("apps", "daemonsets"),
    "lease": ("coordination.k8s.io", "leases"),
}
SUBRESOURCES = ("status", "exec", "log", "proxy")
METHOD = re.compile(
    rf"^(?P<verb>{'|'.join(sorted(VERB_PREFIXES, key=len, reverse=True))})_"
    r"(?:namespaced_|cluster_)?(?P<kind>.+?)(?:_(?P<sub>" + "|".join(SUBRESOURCES) + r"))?(?:_with_path)?$"
)


def grants_of_api_method(name: str, custom: tuple[str, str] | None = None) -> set[Grant]:
    """(apiGroup, resource, verb) of a kubernetes(-asyncio) API method, e.g. create_namespaced_pod;
    ``custom`` is the (group, plural) a CustomObjectsApi call names."""
    match = METHOD.match(name)
    assert match and match["kind"] in CORE_KINDS, f"{name}: no permission mapping; extend tests/unit/test_rbac.py"
    group, resource = CORE_KINDS[match["kind"]]
    if match["kind"] == "custom_object":
        assert custom is not None, name
        group, resource = custom
    if match["kind"] == "role" and "_cluster_role" in name:
        resource = "clusterroles"
    if match["sub"]:
        resource = f"{resource}/{match['sub']}"
    return {(group, resource, verb) for verb in VERB_PREFIXES[match["verb"]]}


# A method's ``plural`` parameter (list_objects_at, watch_objects) stands for what its callers
# pass: a module constant resolves it (list_episodes_at passes PLURAL); a caller outside the client
# that passes a variable may mean any of the operator's own kinds.
PLURAL_PARAMETER = "{plural}"
OWN_PLURALS = (client_module.PLURAL, client_module.SET_PLURAL)


def custom_objects_of(call: ast.Call) -> list[tuple[str, str] | None]:
    """The (group, plural) arguments of a CustomObjectsApi call, their names resolved in client.py
    (a ``plural`` parameter: each of the operator's own plurals); [None] for other calls."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else ""
    if "custom_object" not in name:
        return [None]
    plural_index = 2 if "_cluster_" in name else 3
    group_argument, plural_argument = call.args[0], call.args[plural_index]
    group = str(getattr(client_module, group_argument.id) if isinstance(group_argument, ast.Name) else "")
    if isinstance(group_argument, ast.Constant):
        group = str(group_argument.value)
    if isinstance(plural_argument, ast.Name) and plural_argument.id == "plural":
        return [(group, PLURAL_PARAMETER)]
    if isinstance(plural_argument, ast.Constant):
        return [(group, str(plural_argument.value))]
    assert isinstance(plural_argument, ast.Name), ast.unparse(call)
    return [(group, str(getattr(client_module, plural_argument.id)))]


def grants_of_raw_call(call: ast.Call) -> set[Grant]:
    """``self.api.call_api(f"/apis/{DATA_GROUP}/{DATA_VERSION}/namespaces/{ns}/episodes/{name}/{sub}", "GET", …)``:
    the module's constants resolved; a variable subresource of the data API is any of its subresources."""
    path, method = call.args[0], call.args[1]
    assert isinstance(path, ast.JoinedStr) and isinstance(method, ast.Constant), ast.unparse(call)
    template = ""
    for part in path.values:
        if isinstance(part, ast.Constant):
            template += str(part.value)
        else:
            assert isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name), ast.unparse(call)
            template += str(getattr(client_module, part.value.id, "{}"))
    verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method.value]
    if (template, verb) == ("/apis/{}/{}", "get"):
        return set()  # discovery of a group version: granted to every authenticated client (system:discovery)
    data_api = f"/apis/{served.DATA_GROUP}/{served.DATA_VERSION}/namespaces/{{}}/{served.RESOURCE}/{{}}/{{}}"
    assert template == data_api, f"{template}: no permission mapping; extend tests/unit/test_rbac.py"
    return {(served.DATA_GROUP, f"{served.RESOURCE}/{name}", verb) for name in served.SUBRESOURCES}


def api_objects(node: ast.AST) -> set[str]:
    """Names bound to a generated API class in ``node``: ``self.core = k8s.CoreV1Api(…)`` gives
    "self.core", ``networking: Any = k8s.NetworkingV1Api(…)`` gives "networking"."""
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Assign | ast.AnnAssign) and isinstance(child.value, ast.Call):
            function = child.value.func
            if isinstance(function, ast.Attribute) and function.attr.endswith("Api"):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                found |= {ast.unparse(target) for target in targets}
    return found


def client_methods() -> dict[str, tuple[set[Grant], set[tuple[str, str | None]]]]:
    """KubeClient method -> (the permissions its own API calls need, the KubeClient methods it calls,
    each with the plural it passes for a ``plural`` parameter, if a constant)."""
    tree = ast.parse(CLIENT.read_text())
    (kube_client,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KubeClient"]
    members = api_objects(next(f for f in kube_client.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"))
    assert {"self.core", "self.custom", "self.core_ws"} <= members, members
    methods: dict[str, tuple[set[Grant], set[tuple[str, str | None]]]] = {}
    for function in kube_client.body:
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        objects = members | api_objects(function)
        grants: set[Grant] = set()
        calls: set[tuple[str, str | None]] = set()
        for node in ast.walk(function):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            target, name = ast.unparse(node.func.value), node.func.attr
            if target in objects:
                method_grants = {
                    grant for custom in custom_objects_of(node) for grant in grants_of_api_method(name, custom)
                }
                if any(k.arg == "watch" and ast.unparse(k.value) == "True" for k in node.keywords):
                    # A list call with watch=True is a watch (RBAC's own verb).
                    method_grants = {(group, resource, "watch") for group, resource, _ in method_grants}
                grants |= method_grants
            elif target == "self.api" and name == "call_api":
                grants |= grants_of_raw_call(node)
            elif target == "self":
                first = node.args[0] if node.args else None
                passed = getattr(client_module, first.id, None) if isinstance(first, ast.Name) else None
                calls.add((name, passed if passed in OWN_PLURALS else None))
        methods[function.name] = (grants, calls)
    return methods


def reachable_grants(entry_points: set[str]) -> set[Grant]:
    """The permissions of these KubeClient methods and of every KubeClient method they call."""
    methods = client_methods()
    seen: set[tuple[str, str | None]] = set()
    todo: list[tuple[str, str | None]] = [(name, None) for name in entry_points]
    grants: set[Grant] = set()
    while todo:
        name, plural = todo.pop()
        if (name, plural) in seen or name not in methods:
            continue
        seen.add((name, plural))
        for group, resource, verb in methods[name][0]:
            if resource == PLURAL_PARAMETER:
                grants |= {(group, each, verb) for each in ((plural,) if plural else OWN_PLURALS)}
            else:
                grants.add((group, resource, verb))
        todo += [(called, passed or plural) for called, passed in methods[name][1]]
    return grants


def called_client_methods(files: list[Path]) -> set[str]:
    """The KubeClient methods called (``anything.<method>(…)``) or named (``KubeClient.<method>``,
    e.g. in a table of what to call) in these modules."""
    public = {name for name in client_methods() if not name.startswith("_")}
    called: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in public:
                called.add(node.func.attr)
            elif is_event_record(node):
                called.add("create_event")  # the client's Event recorder (kube/event_recorder.py) posts through it
            named = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            if named and node.value.id == "KubeClient" and node.attr in public:  # type: ignore[attr-defined]
                called.add(node.attr)  # type: ignore[attr-defined]
    return called


def is_event_record(node: ast.AST) -> bool:
    """``<client>.event_recorder.record(…)``: an Event queued on the client's recorder."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "record"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "event_recorder"
    )


def modules(*, cli: bool) -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == CLIENT:
            continue
        if (path.relative_to(PACKAGE).parts[0] == "cli") == cli:
            yield path


def kopf_grants() -> set[Grant]:
    """What kopf needs for the handlers registered by handlers.py: watch (list+watch) every
    resource a handler serves, patch (annotations, finalizer) those with daemons or change
    handlers (event handlers alone keep no state on the object), and post Events."""
    import kopf

    import episode_operator.handlers  # noqa: F401  (registers the handlers)

    registry = kopf.get_default_registry()

    def served(*kinds: Any) -> set[tuple[str, str]]:
        resources = set()
        for handlers in kinds:
            for handler in handlers.get_all_handlers():
                assert handler.selector is not None
                resources.add((handler.selector.group, handler.selector.plural or handler.selector.any_name))
        return resources

    watched = served(registry._spawning, registry._changing, registry._watching, registry._indexing)
    patched = served(registry._spawning, registry._changing)
    assert watched and patched, "no resource handlers registered"
    grants = {(group, plural, verb) for group, plural in watched for verb in ("list", "watch")}
    grants |= {(group, plural, "patch") for group, plural in patched}
    return grants | {("", "events", "create")}


def test_every_client_call_maps_to_a_permission() -> None:
    methods = client_methods()
    assert methods["create_pod"][0] == {("", "pods", "create")}
    assert methods["_exec_connection"][0] == {("", "pods/exec", "get"), ("", "pods/exec", "create")}
    assert methods["get_episode_data"][0] == {
        ("data.episode-operator.dev", "episodes/log", "get"),
        ("data.episode-operator.dev", "episodes/artifacts", "get"),
        ("data.episode-operator.dev", "episodes/turns", "get"),
    }
    assert methods["review_access"][0] == {("authorization.k8s.io", "subjectaccessreviews", "create")}
    assert methods["replace_api_service"][0] == {("apiregistration.k8s.io", "apiservices", "update")}
    assert methods["replace_episode_status"][0] == {(GROUP, f"{PLURAL}/status", "patch")}
    assert reachable_grants({"watch_episodes"}) == {(GROUP, PLURAL, "watch")}  # it passes PLURAL on
    assert reachable_grants({"list_objects_at"}) == {(GROUP, PLURAL, "list"), (GROUP, SET_PLURAL, "list")}
    assert reachable_grants({"exec"}) == reachable_grants({"exec_stream"}) == methods["_exec_connection"][0]


def test_the_operator_is_granted_exactly_what_its_code_and_kopf_use() -> None:
    operator_calls = called_client_methods(list(modules(cli=False)))
    needed = reachable_grants(operator_calls) | kopf_grants()
    declared = rbac.grants(
        rbac.OPERATOR_PERMISSIONS, "namespaced", "data-api", "own-namespace", "data-api-own-namespace"
    )
    assert sorted(needed - declared) == [], "used but not granted: add it to kube/rbac.py"
    assert sorted(declared - needed) == [], "granted but unused: remove it from kube/rbac.py"


def test_the_data_api_rules_are_what_the_data_api_uses() -> None:
    """Granted apart (cluster-wide, and only with the chart's dataApi.enabled), so checked apart."""
    used = reachable_grants(called_client_methods([PACKAGE / "kube" / "data_api_registration.py"]))
    assert used == rbac.grants(rbac.OPERATOR_PERMISSIONS, "data-api", "data-api-own-namespace")
    named = [(p.resource, p.verbs, p.resource_names) for p in rbac.OPERATOR_PERMISSIONS if p.when == "data-api"]
    assert named == [
        ("subjectaccessreviews", ("create",), ()),
        ("apiservices", ("create",), ()),  # a create cannot be narrowed by name
        ("apiservices", ("get", "update", "delete"), (served.API_SERVICE,)),
        ("clusterroles", ("get",), (rbac.DATA_API_CLUSTER_ROLE,)),  # its own, named by the chart
        ("configmaps", ("get",), ("extension-apiserver-authentication",)),
    ]
    # The serving certificate's Secret: in the operator's own namespace only (a Role), not cluster-wide.
    assert [(p.resource, p.verbs) for p in rbac.OPERATOR_PERMISSIONS if p.when == "data-api-own-namespace"] == [
        ("secrets", ("get", "create"))
    ]


def test_kopf_observation_grants_are_cluster_scoped_and_conditional() -> None:
    assert rbac.grants(rbac.OPERATOR_PERMISSIONS, "scanning") == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    }
    assert rbac.grants(rbac.OPERATOR_PERMISSIONS, "namespace-globs") == {
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
    }


def test_the_user_permissions_are_exactly_what_the_cli_uses() -> None:
    cli_calls = called_client_methods(list(modules(cli=True)))
    operator_calls = called_client_methods(list(modules(cli=False)))
    # Every KubeClient method that calls the API is used by the operator, the CLI, or both: so the
    # two declarations together cover every call in client.py.
    calling = {name for name in client_methods() if not name.startswith("_") and reachable_grants({name})}
    assert sorted(calling - cli_calls - operator_calls) == []
    needed = reachable_grants(cli_calls)
    declared = rbac.grants(rbac.USER_PERMISSIONS, "namespaced", "cluster")
    assert sorted(needed - declared) == [], "the CLI uses it but kube/rbac.py USER_PERMISSIONS lacks it"
    assert sorted(declared - needed) == [], "declared for users but the CLI does not use it"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("create_namespaced_pod", {("", "pods", "create")}),
        ("read_namespaced_config_map", {("", "configmaps", "get")}),
        ("create_namespaced_event", {("", "events", "create")}),
        ("connect_get_namespaced_pod_exec", {("", "pods/exec", "get"), ("", "pods/exec", "create")}),
        ("replace_custom_resource_definition", {("apiextensions.k8s.io", "customresourcedefinitions", "update")}),
        ("read_cluster_role", {("rbac.authorization.k8s.io", "clusterroles", "get")}),
        ("read_namespaced_role", {("rbac.authorization.k8s.io", "roles", "get")}),
    ],
)
def test_api_method_names_map_to_rbac(name: str, expected: set[Grant]) -> None:
    assert grants_of_api_method(name) == expected


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)", {(GROUP, PLURAL, "list")}),
        (
            "self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name, body)",
            {(GROUP, f"{PLURAL}/status", "patch")},
        ),
        (
            "self.custom.delete_namespaced_custom_object('g.dev', VERSION, ns, 'things', name)",
            {("g.dev", "things", "delete")},
        ),
    ],
)
def test_custom_object_calls_map_to_their_group_and_plural(call: str, expected: set[Grant]) -> None:
    node = ast.parse(call).body[0]
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
    assert isinstance(node.value.func, ast.Attribute)
    (custom,) = custom_objects_of(node.value)
    assert grants_of_api_method(node.value.func.attr, custom) == expected


def test_an_unknown_api_method_fails_the_mapping() -> None:
    with pytest.raises(AssertionError, match="no permission mapping"):
        grants_of_api_method("create_namespaced_persistent_volume_claim")


def test_the_charts_rules_file_is_generated_from_the_declaration() -> None:
    from tests.conftest import REPO

    assert (REPO / rbac.RBAC_FILE).read_text() == rbac.render_rules(), (
        "run: python -m episode_operator.kube.rbac --write"
    )
