"""The outfit assistant of the article, as a dflow example: a planning flow over a
tool-calling agent that searches the shop's catalogue, proposes outfits, asks the user to
choose in the browser plug-in, tries the chosen one on, and reads the shop's pages with a
deep crawler whose pages the plug-in fetches.

* ``python -m examples.assistant``: everything in one process, offline (see ``run_local``);
* ``app``: what ``dflow worker`` and ``dflow serve`` import;
* ``client``: the browser plug-in, over the HTTP API of ``dflow serve``;
* ``shop``: the tiny local shop the plug-in browses; ``catalogue``: its items;
  ``scripted``: the scripted model.

See ``README.md`` in this folder for the commands.
"""

__all__: list[str] = []
