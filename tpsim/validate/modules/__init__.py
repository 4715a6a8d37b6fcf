"""The torch-side layers the validation ranks build: the transformer block (:mod:`.block`), the MoE MLP
(:mod:`.moe`), context-parallel attention (:mod:`.cp_attention`), torch parallel styles for linears
(:mod:`.styles`) and convolutions (:mod:`.conv_styles`), ZeRO-1's sharded Adam (:mod:`.zero1`)."""
