"""Reference models written out in plain PyTorch (no downloads, no torchvision) for ``tpsim trace``.

* :func:`gpt` — a GPT-2/3 decoder (Radford et al. 2019; Brown et al. 2020) with Megatron's conventions: fused
  QKV projection laid out per head (``[q_h k_h v_h]`` rows, so that a contiguous row split gives each TP rank
  whole heads), pre-norm blocks, GeLU (tanh) MLP, hidden dropout after the attention and the MLP, learned
  positions, output layer tied to the token embedding, cross-entropy against the input tokens (same shapes as
  next-token targets). ``gpt(**preset)`` builds the shapes of the ``gpt3-*`` presets.
* :func:`vit` — Vision Transformer (Dosovitskiy et al. 2021): 16x16 patch convolution, class token, learned
  positions, pre-norm blocks (GeLU MLP), classification head on the class token. :func:`vit_l16` is ViT-L/16
  (24 layers, hidden 1024, 16 heads, MLP 4096, 224x224 images).
* :func:`resnet50` — ResNet-50 (He et al. 2016, Table 1; the torchvision v1.5 layout with the stride on the
  3x3 convolution): bottleneck blocks [3, 4, 6, 3], BatchNorm, ReLU.
* :func:`unet` — a small diffusion-style U-Net (Ronneberger et al. 2015; the residual/GroupNorm/SiLU blocks and
  self-attention at the lowest resolutions of Ho et al. 2020): timestep embedding MLP, two levels down, a middle
  block with attention, two levels up with skip concatenation, nearest upsampling + convolution.

Every model's ``forward`` returns a scalar loss (or logits, which ``tpsim trace`` reduces by their mean), and
holds its blocks in ``nn.ModuleList`` / ``nn.Sequential`` so that repeated blocks are recognised.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# ---- GPT -----------------------------------------------------------------------------------------------
class GPTAttention(nn.Module):
    """Causal self-attention; ``qkv`` rows are per head ``[q_h | k_h | v_h]`` (Megatron's layout)."""

    def __init__(self, hidden: int, heads: int, bias: bool = True) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.qkv(x).view(b, s, -1, 3 * self.head_dim)  # -1: the heads this rank holds
        q, k, v = (t.transpose(1, 2) for t in y.split(self.head_dim, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """fc2(gelu(fc1 x)) with the tanh GeLU (Megatron's bias-gelu)."""

    def __init__(self, hidden: int, ffn: int, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn, bias=bias)
        self.fc2 = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class PreNormBlock(nn.Module):
    """Pre-norm: h = x + drop(attn(ln1 x)); out = h + drop(mlp(ln2 h)), ``attn`` of the subclass's
    ``attention_class`` (a subclass per model: ``tpsim trace`` records module class names)."""

    attention_class: type[nn.Module]

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = self.attention_class(hidden, heads)
        self.drop1 = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.drop1(self.attn(self.ln1(x)))
        return h + self.drop2(self.mlp(self.ln2(h)))


class GPTBlock(PreNormBlock):
    attention_class = GPTAttention


class GPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, layers: int, hidden: int, heads: int, ffn: int | None = None,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq_len, hidden)
        self.blocks = nn.ModuleList(GPTBlock(hidden, heads, ffn or 4 * hidden, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied (GPT-2/3, Megatron's default)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        # the loss in at least fp32 (Megatron's fp32 cross-entropy of bf16 logits; float64 stays float64)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), idx.view(-1))


def gpt(vocab: int = 50304, seq_len: int = 2048, layers: int = 24, hidden: int = 2048, heads: int = 16,
        ffn: int | None = None, dropout: float = 0.1) -> GPT:
    """A GPT decoder (default: the gpt3-1.3b preset's shapes, vocabulary padded to a multiple of 128)."""
    return GPT(vocab, seq_len, layers, hidden, heads, ffn, dropout)


# ---- ViT -----------------------------------------------------------------------------------------------
class ViTAttention(nn.Module):
    """Bidirectional self-attention with a per-head fused ``qkv`` (as :class:`GPTAttention`)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.qkv(x).view(b, s, -1, 3 * self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in y.split(self.head_dim, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(b, s, -1))


class ViTBlock(PreNormBlock):
    attention_class = ViTAttention


class ViT(nn.Module):
    def __init__(self, image: int, patch: int, layers: int, hidden: int, heads: int, ffn: int, classes: int,
                 channels: int = 3, dropout: float = 0.1) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(channels, hidden, patch, stride=patch)
        tokens = (image // patch) ** 2 + 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, hidden))
        self.blocks = nn.ModuleList(ViTBlock(hidden, heads, ffn, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, 0])
        return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))


def vit(image: int = 224, patch: int = 16, layers: int = 12, hidden: int = 768, heads: int = 12,
        ffn: int | None = None, classes: int = 1000, dropout: float = 0.1) -> ViT:
    """A ViT (default ViT-B/16)."""
    return ViT(image, patch, layers, hidden, heads, ffn or 4 * hidden, classes, dropout=dropout)


def vit_l16(classes: int = 1000) -> ViT:
    """ViT-L/16 (Dosovitskiy et al. 2021, Table 1): 24 layers, hidden 1024, MLP 4096, 16 heads; 224x224."""
    return vit(224, 16, 24, 1024, 16, 4096, classes)


# ---- ResNet-50 -----------------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here: ResNet v1.5), 1x1 expand x4; identity or projection shortcut."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        stages, cin = [], width
        for i, n in enumerate(layers):
            w = width * 2 ** i
            blocks = [Bottleneck(cin, w, stride=1 if i == 0 else 2)]
            cin = w * Bottleneck.expansion
            blocks += [Bottleneck(cin, w) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
        self.stages = len(stages)
        for i, stage in enumerate(stages):  # torchvision's names: layer1 .. layer4
            self.add_module(f"layer{i + 1}", stage)
        self.fc = nn.Linear(cin, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(images))), 3, stride=2, padding=1)
        for i in range(self.stages):
            x = getattr(self, f"layer{i + 1}")(x)
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))


def resnet(layers: tuple[int, ...] = (3, 4, 6, 3), width: int = 64, classes: int = 1000) -> ResNet:
    """A bottleneck ResNet (default ResNet-50); e.g. ``layers=(1, 1), width=8`` for a tiny test model."""
    return ResNet(tuple(layers), classes, width)


def resnet50(classes: int = 1000) -> ResNet:
    """ResNet-50 (He et al. 2016): 25.6 M parameters, 4.1 GFLOP (multiply-adds) per 224x224 image."""
    return ResNet((3, 4, 6, 3), classes)


# ---- U-Net ---------------------------------------------------------------------------------------------
def timestep_embedding(t: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sinusoidal embedding of the diffusion timestep (Vaswani et al. 2017 / Ho et al. 2020), in ``dtype``."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=dtype) / half)
    args = t.to(dtype)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    """GroupNorm-SiLU-conv3x3, + timestep projection, GroupNorm-SiLU-conv3x3, 1x1 skip if channels change."""

    def __init__(self, cin: int, cout: int, temb: int, groups: int = 32) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(emb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (x if self.skip is None else self.skip(x))


class AttnBlock(nn.Module):
    """Self-attention over the pixels of a feature map (per-head fused qkv, as the transformers above)."""

    def __init__(self, channels: int, heads: int, groups: int = 32) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        self.attn = ViTAttention(channels, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x).flatten(2).transpose(1, 2)
        return x + self.attn(y).transpose(1, 2).reshape(b, c, h, w)


class Level(nn.Module):
    """Resolution level: residual blocks (+ attention)."""

    def __init__(self, cin: int, cout: int, temb: int, blocks: int, attention: bool, heads: int) -> None:
        super().__init__()
        self.res = nn.ModuleList(ResBlock(cin if i == 0 else cout, cout, temb) for i in range(blocks))
        self.attn = nn.ModuleList(AttnBlock(cout, heads) for _ in range(blocks)) if attention else None

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.res):
            x = block(x, emb)
            if self.attn is not None:
                x = self.attn[i](x)
        return x


class UNet(nn.Module):
    def __init__(self, channels: int = 3, base: int = 128, mults: tuple[int, ...] = (1, 2, 2),
                 attention: tuple[bool, ...] = (False, True, True), blocks: int = 2, heads: int = 4) -> None:
        super().__init__()
        temb = 4 * base
        self.temb = nn.Sequential(nn.Linear(base, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.base = base
        self.conv_in = nn.Conv2d(channels, base, 3, padding=1)
        widths = [base * m for m in mults]
        self.down = nn.ModuleList()
        self.downsample = nn.ModuleList()
        cin = base
        for i, w in enumerate(widths):
            self.down.append(Level(cin, w, temb, blocks, attention[i], heads))
            self.downsample.append(nn.Conv2d(w, w, 3, stride=2, padding=1) if i < len(widths) - 1 else nn.Identity())
            cin = w
        self.mid = Level(cin, cin, temb, 2, True, heads)
        self.up = nn.ModuleList()
        self.upsample = nn.ModuleList()
        for i, w in reversed(list(enumerate(widths))):
            self.up.append(Level(cin + w, w, temb, blocks, attention[i], heads))
            self.upsample.append(nn.Conv2d(w, w, 3, padding=1) if i > 0 else nn.Identity())
            cin = w
        self.norm_out = nn.GroupNorm(32, cin)
        self.conv_out = nn.Conv2d(cin, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        emb = self.temb(timestep_embedding(t, self.base, self.conv_in.weight.dtype))
        h = self.conv_in(x)
        skips = []
        for level, down in zip(self.down, self.downsample):
            h = level(h, emb)
            skips.append(h)
            h = down(h)
        h = self.mid(h, emb)
        for level, up in zip(self.up, self.upsample):
            h = level(torch.cat([h, skips.pop()], dim=1), emb)
            if not isinstance(up, nn.Identity):
                h = up(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        out = self.conv_out(F.silu(self.norm_out(h)))
        return F.mse_loss(out, x)


def unet(base: int = 128, mults: tuple[int, ...] = (1, 2, 2), blocks: int = 2, heads: int = 4) -> UNet:
    """A small diffusion U-Net (~35 M parameters at the defaults; 64x64 images: --input-shape 8,3,64,64 8)."""
    return UNet(3, base, tuple(mults), tuple(i > 0 for i in range(len(mults))), blocks, heads)
