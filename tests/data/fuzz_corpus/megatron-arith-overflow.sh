torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers $(( 99999999999 * 99999999999 * 99999999999 )) --hidden-size 64
