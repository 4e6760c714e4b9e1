#!/usr/bin/env python3
"""Prints the workspace crates' dependency graph (normal, build and dev edges) and fails on a cycle.
usage: scripts/check-crate-graph.py [WORKSPACE_DIR]"""
import json, subprocess, sys
m=json.loads(subprocess.check_output(["cargo","metadata","--format-version","1","--no-deps","--offline"],cwd=(sys.argv[1] if len(sys.argv) > 1 else ".")))
ws={p["name"] for p in m["packages"]}
g={}
for p in m["packages"]:
    g[p["name"]]=sorted({(d["name"],d["kind"] or "normal") for d in p["dependencies"] if d["name"] in ws})
for k,v in sorted(g.items()): print(k,"->",", ".join(f"{n}({kind})" for n,kind in v))
# cycle check including dev deps
adj={k:[n for n,_ in v] for k,v in g.items()}
state={}
def dfs(u,path):
    state[u]=1
    for w in adj[u]:
        if state.get(w)==1: print("CYCLE:", " -> ".join(path+[u,w])); sys.exit(1)
        if not state.get(w): dfs(w,path+[u])
    state[u]=2
for k in adj:
    if not state.get(k): dfs(k,[])
print("no cycle among workspace crates (normal, build and dev dependencies)")
