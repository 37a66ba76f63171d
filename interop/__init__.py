"""Adapters at the edge of the suite: other tools' objects in and out, one module per job (importer,
export, oracle, peer; common holds TorchRec's objects for an instance). The registries name what lives here
(the `torchrec` oracle in costmodels, the `torchrec-*` peers in solvers.peers) and import it when used;
torchrec itself loads only when one of them is built or run."""
