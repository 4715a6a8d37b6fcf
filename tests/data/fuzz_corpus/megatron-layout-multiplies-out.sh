torchrun --nproc_per_node 8 pretrain_gpt.py --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "(t*1000000)*2000" --num-layers 4
