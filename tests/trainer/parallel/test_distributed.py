"""Multi-host start-up arguments from Vertex AI's CLUSTER_SPEC."""

import json

from trainer.parallel import distributed


def _spec(task_type, index):
    return json.dumps({
        "cluster": {"workerpool0": ["chief-0:2222"], "workerpool1": ["worker-0:2222", "worker-1:2222", "worker-2:2222"]},
        "task": {"type": task_type, "index": index}, "job": "{}",
    })


def test_every_host_gets_its_own_process_id_and_the_chief_coordinates():
    chief = distributed.cluster_from_spec(_spec("workerpool0", 0))
    assert chief == distributed.ProcessGroup(f"chief-0:{distributed.COORDINATOR_PORT}", num_processes=4, process_id=0)
    ids = [distributed.cluster_from_spec(_spec("workerpool1", i)).process_id for i in range(3)]
    assert ids == [1, 2, 3]


def test_one_host_needs_no_coordination():
    single = json.dumps({"cluster": {"workerpool0": ["chief-0:2222"]}, "task": {"type": "workerpool0", "index": 0}})
    assert distributed.cluster_from_spec(single) is None
