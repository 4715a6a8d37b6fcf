torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --num-experts 8 --moe-layer-freq "[1]*20000*20000"
