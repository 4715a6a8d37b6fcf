"""Models whose forward returns outputs, not a loss (issue 22: "grad can be implicitly created only for scalar
outputs"): validated with the synthetic loss of tpsim.validate.modules.loss (the mean of the first output)."""

import torch
import torch.nn.functional as F

from tpsim.trace.zoo import ResNet


class LogitsResNet(ResNet):
    """The zoo's bottleneck ResNet returning its classifier's logits (batch x classes)."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(images))), 3, stride=2, padding=1)
        for i in range(self.stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_convnet(width: int = 8, classes: int = 10) -> LogitsResNet:
    return LogitsResNet((1, 1), classes, width)
