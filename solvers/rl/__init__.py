"""Learned sharding policies on one MDP (AutoShard §4.3–4.5, DreamShard appendix B), by stage: the MDP
(mdp), the two policies and how they play it (policies), training (training), saving and the shipped
weights (storage), and the registered solvers' entry point (solving).

Tables are placed one per step in descending order of predicted single-table cost; a step sees the table's
representation and the share of tables placed, and chooses among the devices that still have memory for
it. Table representations come from the neural cost model's table MLP (shared with it, frozen), and the
cost model also supplies each device's predicted costs."""
