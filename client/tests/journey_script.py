"""The engineer's journey, as a user's script: run by the python of a fresh virtualenv that has
only ``pip install ./client`` (no Django), against a live server named by RANKOPS_URL,
RANKOPS_TOKEN and RANKOPS_WORKSPACE. Prints one JSON line of what it saw."""

import json
import sys

import pandas as pd
import rankops

client = rankops.Client()
seen = {}

# Every operation of the server's live schema is one the installed client can call.
schema = client.request("GET", "/api/schema/", params={"format": "json"})
live = {
    op["operationId"]
    for item in schema["paths"].values()
    for method, op in item.items()
    if method in ("get", "post", "put", "patch", "delete")
}
seen["unreachable"] = sorted(live - set(client.operations()))

# Register two feature groups, their schema taken from DataFrames, and push the frames.
T0 = pd.Timestamp("2026-01-01T00:00:00Z")
users = pd.DataFrame(
    {
        "user_id": [f"u{i}" for i in range(12)],
        "event_time": [T0] * 12,
        "age": [20 + i for i in range(12)],
        "ctr": [0.01 * i for i in range(12)],
    }
)
labels = pd.DataFrame(
    {
        "user_id": [f"u{i % 12}" for i in range(120)],
        "item_id": [f"i{(i * 7) % 20}" for i in range(120)],
        "event_time": [T0 + pd.Timedelta(hours=1)] * 120,
        "clicked": [int((i % 12) >= 6) ^ int(i % 5 == 0) for i in range(120)],
    }
)
client.register_feature_group("users", entity="user", entity_keys="user_id", features=users)
client.register_feature_group(
    "clicks", entity="label", entity_keys=["user_id", "item_id"], features=labels, online=False
)
first = client.push("users", users, idempotency_key="users-1")
again = client.push("users", users, idempotency_key="users-1")  # a retry: stored once
seen["push"] = [first, again]
client.push("clicks", labels)
looked_up = client.lookup(["u3", "u11", "nobody"], ["users:age"])
seen["lookup"] = json.loads(looked_up.to_json(orient="records"))

# A typed error carries the envelope's code and attr.
try:
    client.register_feature_group(
        "users", entity="user", entity_keys="user_id", features=[{"name": "x", "dtype": "int"}]
    )
except rankops.ApiError as exc:
    seen["duplicate"] = {"class": type(exc).__name__, "code": exc.code, "attr": exc.attr}

dataset = client.build_dataset(
    "train", label_source="clicks", label_columns=["clicked"], features=["users:age", "users:ctr"]
)
frame = client.dataset_frame(dataset["id"])
seen["dataset"] = {"id": dataset["id"], "rows": len(frame), "columns": list(frame.columns)}
seen["paged"] = [
    g["name"] for g in client.iterate("v1_workspaces_feature_groups_list", page_size=1)
]

job = client.train("journey", dataset=dataset["id"], template="logreg")
log = []
job = client.wait_job(job["id"], on_log=log.append, progress=True)
seen["job"] = {"id": job["id"], "state": job["state"], "log": log}

control = client.register_model("ranker", job_id=job["id"])
treatment = client.register_model("ranker", job_id=job["id"])
deployment = client.deploy("main", version_id=control["id"])
seen["deployment"] = deployment["name"]
experiment = client.launch_experiment(
    "journey-ab",
    deployment="main",
    treatment_versions=[treatment["id"]],
    hypothesis="the same model twice: no difference",
    min_units=20,
    guardrails=[{"metric": "ctr", "max_drop": 0.1}],
    ramp_plan=[5, 10],
)
analysis = client.analysis("journey-ab")
seen["experiment"] = {"state": experiment["state"], "analysis_keys": sorted(analysis)}
seen["versions"] = [control["id"], treatment["id"]]
print(json.dumps(seen, default=str))
sys.exit(0)
