"""The merged stack tree: each frame with the ranks whose stacks pass through it."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Tree
from textual.widgets.tree import TreeNode as UiNode

from areal_console.core.stacks.merge import TreeNode, format_ranks
from areal_console.core.stacks.records import Frame

# Above this many frames, only the trunk and the first levels below it start expanded.
EXPAND_ALL_LIMIT = 2000


def node_label(node: TreeNode, total: int) -> Text:
    assert node.frame is not None
    frame = node.frame
    text = Text(frame.function, style="bold" if len(node.ranks) < total else "")
    text.append(f"  {frame.file.rsplit('/', 1)[-1]}:{frame.line}", style="dim")
    style = "cyan" if len(node.ranks) == total else "bold yellow"
    text.append(f"  [{node.label}]", style=style)
    text.append(f" ({len(node.ranks)})", style="dim")
    return text


def count_nodes(root: TreeNode) -> int:
    return sum(1 for _ in root.walk())


class StackTree(Tree[Frame | None]):
    """Root first, so the trunk all ranks share is at the top and branches show where
    ranks part ways. Built once per capture and view mode, never per keystroke."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__("stacks", *args, **kwargs)  # type: ignore[arg-type]
        self.show_root = False
        self.group_nodes: dict[int, UiNode[Frame | None]] = {}

    def show_tree(self, trees: dict[str, TreeNode], total: int, by_thread: bool = False) -> None:
        """One merged tree, or (`by_thread`) one per thread name under a heading each."""
        self.clear()
        self.group_nodes = {}
        size = sum(count_nodes(t) for t in trees.values())
        expand_all = size <= EXPAND_ALL_LIMIT
        for name, root in trees.items():
            parent: UiNode[Frame | None] = self.root
            if by_thread:
                label = Text(name, style="bold magenta")
                label.append(f"  [{format_ranks(root.ranks)}] ({len(root.ranks)})", style="dim")
                parent = self.root.add(label, data=None, expand=True)
            self._add_frames(parent, root, total, expand_all)
        self.root.expand()

    def _add_frames(
        self, parent: UiNode[Frame | None], node: TreeNode, total: int, expand_all: bool
    ) -> None:
        """Chains of frames (one child each) stay at one indent; only a branch point,
        where ranks part ways, indents. Deep stacks stay readable in a narrow pane."""
        work = [(parent, node, 0)]  # iterative: stacks are deep
        while work:
            ui_parent, tree_node, branch_depth = work.pop()
            children = sorted(
                tree_node.children.values(), key=lambda c: (-len(c.ranks), min(c.ranks))
            )
            if len(children) == 1:
                child = children[0]
                ui = ui_parent.add_leaf(node_label(child, total), data=child.frame)
                for g in child.groups:
                    self.group_nodes[g] = ui
                work.append((ui_parent, child, branch_depth))
                continue
            for child in reversed(children):
                expand = expand_all or branch_depth < 2
                ui = ui_parent.add(
                    node_label(child, total),
                    data=child.frame,
                    expand=expand,
                    allow_expand=bool(child.children),
                )
                for g in child.groups:
                    self.group_nodes[g] = ui
                work.append((ui, child, branch_depth + 1))

    def reveal_group(self, index: int) -> bool:
        """Select the leaf frame of group `index`, expanding the way there."""
        ui = self.group_nodes.get(index)
        if ui is None:
            return False
        parent = ui.parent
        while parent is not None:
            parent.expand()
            parent = parent.parent
        self.move_cursor(ui)
        self.scroll_to_node(ui)
        return True

    @property
    def current_frame(self) -> Frame | None:
        node = self.cursor_node
        return node.data if node is not None else None
