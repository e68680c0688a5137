"""The interface each family kind implements for mmsp.patch (one module per kind)."""

from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from mmsp.transformers_patch.families import Family


class VisionReader:
    """Reads one collator batch's vision inputs sequence by sequence, in order."""

    def of_sequence(self, b: int, ids: list[int]) -> dict[str, Any]:
        """The planner's vision fields of sequence b (image_grid_thw, video_grid_thw, ...)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Every grid given was used by some sequence; a ValueError otherwise."""


class Kind:
    name: str = ""
    takes_videos: bool = False
    deepstack: bool = False
    encodes_with_grids: bool = False  # its tower takes the items' grid rows [n, 3] (Qwen)

    def serves(self, conventions: dict[str, Any], config: Any) -> bool:
        """Whether a model of these conventions (mmsp._C.model_conventions) and config is of this kind."""
        raise NotImplementedError

    def reader(self, config: Any, family: "Family", image_grid_thw: Optional[torch.Tensor],
               video_grid_thw: Optional[torch.Tensor], second_per_grid_ts: Optional[torch.Tensor]) -> VisionReader:
        raise NotImplementedError

    def pixel_rows(self, grids: list[list[int]]) -> list[int]:
        """Rows of pixel_values each item takes: patches (Qwen), tiles (InternVL), one image (LLaVA)."""
        raise NotImplementedError

    def encode(self, model: Any, pixel_values: torch.Tensor, grid_thw: Optional[torch.Tensor],
               video: bool = False) -> tuple[torch.Tensor, Optional[list[torch.Tensor]]]:
        """The tower on some items: their placeholder rows in order [N, h], and deepstack rows or None."""
        raise NotImplementedError

    def decoder_inputs(self, positions: torch.Tensor, slots: list[int], length: int,
                       deepstack: Optional[list[torch.Tensor]], device: torch.device) -> tuple[torch.Tensor, dict]:
        """The decoder's position_ids and extra keyword arguments for this rank's slots."""
        return positions, {}
