torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size ² --num-layers 4
