"""Subject naming: the name→token encoding is reversible, one-to-one and always one valid token."""

import random
import re
import string

import pytest

from shared.bus import subjects
from shared.bus.errors import InvalidResourceName
from shared.bus.subjects import SubjectKind
from shared.shards import shard_of

KV_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")
# A single NATS subject token: no separators, wildcards, whitespace or control characters.
TOKEN = re.compile(r"^[^.*>\s\x00-\x1f]+$")

TRICKY = [
    "a",
    "my.runner.set",
    "a..b",
    ".leading",
    "trailing.",
    "under_score",
    "_2e",  # looks like an escape
    "__",
    "x" * 253,
    "*",
    ">",
    "with space",
    "tab\there",
    "ünïcødé",
    "日本",
    "emoji-🙂",
    "UPPER.lower-1",
    "a/b",
    "0",
]


def _random_names(n: int) -> list[str]:
    rnd = random.Random(5)
    alphabet = string.ascii_lowercase + string.digits + "-._*> /\\_üé🙂\t"
    return ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 60))) for _ in range(n)]


@pytest.mark.parametrize("name", TRICKY + _random_names(500))
def test_token_round_trips_and_is_one_valid_token(name: str) -> None:
    token = subjects.encode_token(name)
    assert subjects.decode_token(token) == name
    assert TOKEN.match(token), token
    assert KV_KEY.match(token), token
    assert "." not in token


def test_kubernetes_names_stay_readable() -> None:
    assert subjects.encode_token("my-set-abcde") == "my-set-abcde"
    assert subjects.encode_token("my.set") == "my_2eset"


def test_encoding_is_one_to_one() -> None:
    names = TRICKY + _random_names(2000)
    tokens = {subjects.encode_token(n) for n in set(names)}
    assert len(tokens) == len(set(names))


@pytest.mark.parametrize("token", ["", "a_", "a_2", "a_zz", "a_61", "a.b", "a*", "ü", "_ff"])
def test_tokens_the_encoder_cannot_produce_are_rejected(token: str) -> None:
    with pytest.raises(InvalidResourceName):
        subjects.decode_token(token)


def test_empty_name_is_rejected_with_a_clear_error() -> None:
    with pytest.raises(InvalidResourceName, match="non-empty"):
        subjects.encode_token("")


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        (subjects.desired_subject("ns", "a.b"), (SubjectKind.DESIRED, "ns", "a.b", "")),
        (subjects.job_started_subject("ns", "s.1"), (SubjectKind.JOB_STARTED, "ns", "s.1", "")),
        (subjects.job_completed_subject("ns", "s"), (SubjectKind.JOB_COMPLETED, "ns", "s", "")),
        (subjects.revision_published_subject("n", "e"), (SubjectKind.REVISION_PUBLISHED, "n", "e", "")),
        (subjects.revision_applied_subject("n", "e"), (SubjectKind.REVISION_APPLIED, "n", "e", "")),
        (
            subjects.resource_changed_subject("AutoscalingListener", "n", "l.1"),
            (SubjectKind.RESOURCE_CHANGED, "n", "l.1", "autoscalinglistener"),
        ),
        ("runnerscale.desired.ns", (SubjectKind.UNKNOWN, "", "", "")),
        ("runnerscale.jobs.ns.s.exploded", (SubjectKind.UNKNOWN, "", "", "")),
        ("other.desired.ns.x", (SubjectKind.UNKNOWN, "", "", "")),
    ],
)
def test_parse_subject(subject: str, expected: tuple[SubjectKind, str, str, str]) -> None:
    info = subjects.parse_subject(subject)
    assert (info.kind, info.namespace, info.name, info.resource_kind) == expected


def test_every_subject_is_covered_by_exactly_one_stream() -> None:
    samples = [
        subjects.desired_subject("n", "a"),
        subjects.job_started_subject("n", "a"),
        subjects.revision_applied_subject("n", "a"),
        subjects.resource_changed_subject("K", "n", "a"),
    ]
    for subject in samples:
        family = subject.split(".")[1]
        owners = [s for s in subjects.STREAMS if any(f.split(".")[1] == family for f in s.subjects)]
        assert len(owners) == 1, subject


def test_consumers_filter_inside_their_stream() -> None:
    streams = {s.name: s for s in subjects.STREAMS}
    for consumer in subjects.CONSUMERS:
        stream = streams[consumer.stream]
        for filt in consumer.filter_subjects:
            assert any(filt.startswith(s.removesuffix(">")) for s in stream.subjects), (consumer.durable, filt)


def test_shard_of_is_stable_across_processes_and_in_range() -> None:
    # crc32 is fixed by definition; Python's hash() would change per process.
    assert shard_of("arc-runners/my-set", 16) == shard_of("arc-runners/my-set", 16)
    import zlib

    assert shard_of("arc-runners/my-set", 16) == zlib.crc32(b"arc-runners/my-set") % 16
    counts = [0] * 16
    for i in range(3200):
        counts[shard_of(f"ns/runner-{i}", 16)] += 1
    assert min(counts) > 120 and max(counts) < 280  # roughly uniform


def test_lease_keys_are_valid_kv_keys() -> None:
    assert KV_KEY.match(subjects.member_key("runner-set", "pod.with.dots-0"))
    assert KV_KEY.match(subjects.listener_lease_name("ns", "my.scale.set"))


def test_every_bucket_is_named_here_including_the_listener_sessions() -> None:
    assert subjects.SESSIONS_BUCKET == "runnerscale_listener_sessions"  # the name deployed listeners use
    assert tuple(b.name for b in subjects.BUCKET_SPECS) == subjects.BUCKETS
    # issue 10: the per-shard lease bucket runnerscale_shards is gone (ownership is member records)
    assert set(subjects.BUCKETS) == {
        "runnerscale_members",
        "runnerscale_leaders",
        subjects.SESSIONS_BUCKET,
    }
    # Lease buckets expire with the lease TTL; session records must not expire.
    assert {b.name for b in subjects.BUCKET_SPECS if b.lease} == {
        "runnerscale_members",
        "runnerscale_leaders",
    }
    assert subjects.listener_session_key(7) == "scaleset-7"
    assert KV_KEY.match(subjects.listener_session_key(2147483647))
