"""Image references and the operator's image mirrors (pure).

An air-gapped cluster cannot pull ``ubuntu:24.04`` from Docker Hub; its operator maps public
references to a registry it can reach. A mirror rule maps one of three things, most specific
first:

- a **reference** with a tag or digest (``ubuntu:24.04``) to a whole reference;
- a **repository** without tag or digest (``ubuntu``) to another repository, keeping the tag
  or digest of the image that matched (``ubuntu:22.04`` → ``mirror/ubuntu:22.04``);
- a **prefix** ending in ``/`` (``docker.io/library/``) to another prefix, keeping the rest
  (``python:3.12`` → ``registry.internal/library/python:3.12``); the longest prefix wins.

References are compared in Docker's normal form (``ubuntu`` is ``docker.io/library/ubuntu``,
``index.docker.io`` is ``docker.io``), parsed by ``docker-image-py``, a port of the
distribution project's reference grammar. The same rules apply to every image the operator
names: task images, Dockerfile ``FROM`` lines, compose sidecars and verifier images.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from docker_image import reference as docker_reference

RuleKind = Literal["reference", "repository", "prefix"]
# The order in which rules of each kind are tried: the most specific first.
RULE_PRECEDENCE: tuple[RuleKind, ...] = ("reference", "repository", "prefix")


class InvalidImageReference(ValueError):
    """A string that is not a Docker image reference; the message says why."""


@dataclass(frozen=True)
class ImageReference:
    """A reference in Docker's normal form: ``repository[:tag][@digest]``."""

    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        text = self.repository
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    @property
    def pinned(self) -> bool:
        """True when it names one image (a tag or a digest), not a whole repository."""
        return bool(self.tag or self.digest)


def parse_image_reference(text: str) -> ImageReference:
    """``text`` in Docker's normal form, or :class:`InvalidImageReference` saying why not."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidImageReference(f"{text!r} is not an image reference: it is empty")
    try:
        parsed = docker_reference.Reference.parse_normalized_named(text.strip())
    except Exception as error:  # the library raises its own hierarchy and, on odd input, ValueError
        raise InvalidImageReference(f"{text!r} is not an image reference: {error}") from None
    return ImageReference(str(parsed["name"]), parsed["tag"], parsed["digest"])


@dataclass(frozen=True)
class MirrorRule:
    """One ``FROM=TO`` rule; ``source`` and ``target`` in normal form (prefixes end with ``/``)."""

    kind: RuleKind
    source: str
    target: str

    def apply(self, image: ImageReference) -> str | None:
        """The mirrored reference, or None when the rule does not match ``image``."""
        if self.kind == "reference":
            return self.target if str(image) == self.source else None
        if self.kind == "repository":
            if image.repository != self.source:
                return None
            return str(ImageReference(self.target, image.tag, image.digest))
        if not image.repository.startswith(self.source):
            return None
        return str(ImageReference(self.target + image.repository[len(self.source) :], image.tag, image.digest))


def parse_mirror_rule(source: str, target: str) -> MirrorRule:
    """A rule from its two sides; :class:`InvalidImageReference` names the side that is wrong."""
    source, target = source.strip(), target.strip()
    if source.endswith("/") or target.endswith("/"):
        if not (source.endswith("/") and target.endswith("/")):
            raise InvalidImageReference(
                f"{source}={target}: a prefix maps to a prefix; end both sides with '/' or neither"
            )
        return MirrorRule("prefix", _prefix(source), _prefix(target))
    matched = parse_image_reference(source)
    mirror = parse_image_reference(target)
    if matched.pinned:
        return MirrorRule("reference", str(matched), str(mirror))
    if mirror.pinned:
        raise InvalidImageReference(
            f"{source}={target}: a repository maps to a repository (every tag of it); "
            f"give {source} a tag to map one image"
        )
    return MirrorRule("repository", matched.repository, mirror.repository)


def _prefix(text: str) -> str:
    """A prefix in normal form: a registry host alone (``docker.io/``) or a repository path prefix."""
    head = text.rstrip("/")
    if "/" not in head and ("." in head or ":" in head or head == "localhost"):
        # A whole registry; Docker Hub's other spelling is normalised like references are.
        return "docker.io/" if head == "index.docker.io" else f"{head}/"
    # A path prefix: normalised through a repository it would cover ("library/" is Docker Hub's).
    probe = "probe"
    try:
        normal = parse_image_reference(f"{head}/{probe}").repository
    except InvalidImageReference as error:
        raise InvalidImageReference(f"{text!r} is not a registry or repository prefix") from error
    return normal[: -len(probe)]


@dataclass(frozen=True)
class ImageMirrors:
    """The operator's mirror rules; :meth:`apply` maps one image reference."""

    rules: tuple[MirrorRule, ...] = ()

    @classmethod
    def parse(cls, specs: Iterable[str]) -> ImageMirrors:
        """Rules from ``FROM=TO`` strings (the ``--image-mirror`` flag), in any order."""
        rules = []
        for spec in specs:
            source, separator, target = spec.partition("=")
            if not separator or not source.strip() or not target.strip():
                raise InvalidImageReference(f"{spec!r}: write a mirror as FROM=TO")
            rules.append(parse_mirror_rule(source, target))
        return cls.from_rules(rules)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, str]) -> ImageMirrors:
        """Rules from a ``{FROM: TO}`` mapping (the Helm value ``imageMirrors``)."""
        return cls.from_rules(parse_mirror_rule(source, target) for source, target in mapping.items())

    @classmethod
    def from_rules(cls, rules: Iterable[MirrorRule]) -> ImageMirrors:
        by_source: dict[tuple[RuleKind, str], MirrorRule] = {}
        for rule in rules:
            known = by_source.get((rule.kind, rule.source))
            if known is not None and known.target != rule.target:
                raise InvalidImageReference(
                    f"{rule.source} is mirrored twice, to {known.target} and to {rule.target}; keep one"
                )
            by_source[(rule.kind, rule.source)] = rule
        # Most specific first: kinds in precedence order, longer prefixes before shorter ones.
        ordered = sorted(
            by_source.values(), key=lambda rule: (RULE_PRECEDENCE.index(rule.kind), -len(rule.source), rule.source)
        )
        return cls(tuple(ordered))

    def apply(self, image: str) -> str:
        """``image`` as the cluster should pull it: mirrored by the first matching rule, else unchanged.

        An image no rule matches is returned exactly as written (not normalised), so a
        cluster without mirrors sees the names the task gave. :class:`InvalidImageReference`
        when ``image`` is not a reference at all and some rule might have applied.
        """
        if not self.rules:
            return image
        parsed = parse_image_reference(image)
        for rule in self.rules:
            mirrored = rule.apply(parsed)
            if mirrored is not None:
                return mirrored
        return image

    def as_flags(self) -> list[str]:
        """The rules as ``--image-mirror`` values (prefixes and repositories as given, in normal form)."""
        return [f"{rule.source}={rule.target}" for rule in self.rules]
