"""Double of the two calls of vllm.distributed.parallel_state that a worker
uses to know its tensor-parallel rank; tests set RANK and WORLD."""

RANK, WORLD = 0, 1


def get_tensor_model_parallel_rank():
    return RANK


def get_tensor_model_parallel_world_size():
    return WORLD
