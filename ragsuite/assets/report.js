const RUNS = JSON.parse(document.getElementById('data').textContent);
const PAGE = 50;
let page = 0;
function esc(s){return String(s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));}
function status(r){if(r.error)return 'failed';const m=r.metrics||{};const p=r.primary;return (m[p]||0)>=1?'right':(m[p]>0?'partial':'wrong');}
function passages(ids,gold){return (ids||[]).map(i=>`<span class="${gold.has(i)?'gold':''}">${esc(i)}</span>`).join(', ');}
// Word-level diff of two notes: longest common subsequence of word and space tokens, after trimming the common
// prefix and suffix. Past DIFF_CELLS table cells it diffs lines instead, and past that it marks the changed
// middle as deleted and inserted whole (still a correct diff, only not the smallest).
const DIFF_CELLS=1e6;
function lcs(a,b){
  let pre=0;while(pre<a.length&&pre<b.length&&a[pre]===b[pre])pre++;
  let suf=0;while(suf<a.length-pre&&suf<b.length-pre&&a[a.length-1-suf]===b[b.length-1-suf])suf++;
  const A=a.slice(pre,a.length-suf),B=b.slice(pre,b.length-suf),n=A.length,m=B.length;
  if(n*m>DIFF_CELLS)return null;
  const out=a.slice(0,pre).map(t=>['=',t]);const w=m+1;const L=new Uint32Array((n+1)*w);
  for(let i=n-1;i>=0;i--)for(let j=m-1;j>=0;j--)L[i*w+j]=A[i]===B[j]?L[(i+1)*w+j+1]+1:Math.max(L[(i+1)*w+j],L[i*w+j+1]);
  let i=0,j=0;
  while(i<n&&j<m){if(A[i]===B[j]){out.push(['=',A[i]]);i++;j++;}else if(L[(i+1)*w+j]>=L[i*w+j+1])out.push(['-',A[i++]]);else out.push(['+',B[j++]]);}
  while(i<n)out.push(['-',A[i++]]);while(j<m)out.push(['+',B[j++]]);
  a.slice(a.length-suf).forEach(t=>out.push(['=',t]));return out;}
function diffOps(before,after){
  const words=s=>s.match(/\s+|\S+/g)||[];const lines=s=>s.match(/[^\n]*\n|[^\n]+/g)||[];
  let ops=lcs(words(before),words(after))||lcs(lines(before),lines(after));
  if(!ops)ops=[['-',before],['+',after]];
  // A space kept between two changes splits one edit in two: count it as changed too.
  const out=[];ops.forEach((o,k)=>{if(o[0]==='='&&!/\S/.test(o[1])&&k>0&&k<ops.length-1&&ops[k-1][0]!=='='&&ops[k+1][0]!=='='){out.push(['-',o[1]],['+',o[1]]);}else out.push(o);});
  return out;}
function noteDiff(before,after,accepted){
  if(typeof after!=='string')return '<div class="notediff rej"><b>note</b>: no updated note (the update could not be parsed); the best note stays</div>';
  const ops=diffOps(before,after);let html='',del='',ins='',nd=0,ni=0;
  const flush=()=>{if(del)html+=`<del>${esc(del)}</del>`;if(ins)html+=`<ins>${esc(ins)}</ins>`;del=ins='';};
  ops.forEach(([op,t])=>{if(op==='=' ){flush();html+=esc(t);}else if(op==='-'){del+=t;if(/\S/.test(t))nd++;}else{ins+=t;if(/\S/.test(t))ni++;}});flush();
  return `<div class="notediff ${accepted?'acc':'rej'}"><b>note ${accepted?'accepted':'rejected'}</b>: +${ni} / −${nd} words against the best note before this step<div class="diff">${html}</div></div>`;}
function event(e,gold,diff){
  const rows=Object.entries(e).filter(([k])=>k!=='stage'&&!(diff&&k==='note')).map(([k,v])=>{
    if(/passage_ids|retrieved_ids|kept|dropped|used/.test(k)&&Array.isArray(v))return `<b>${esc(k)}</b>: ${passages(v,gold)}`;
    if(k==='accepted')return `<b>accepted</b>: <span class="${v?'acc':'rej'}">${v?'yes':'no'}</span>`;
    if(typeof v==='string'&&v.length>80)return `<b>${esc(k)}</b>:<pre>${esc(v)}</pre>`;
    return `<b>${esc(k)}</b>: ${esc(typeof v==='object'?JSON.stringify(v):v)}`;});
  return `<div class="ev"><b>[${esc(e.stage)}]</b> ${rows.join(' · ')}${diff||''}</div>`;}
// DeepNote and Adaptive-Note: each step's note is shown as a diff against the best note it set out to improve
// (the initial note, then the last accepted one).
function traceHtml(r,gold){let best=null;return (r.trace||[]).map(e=>{
  if(e.stage==='note_init'&&typeof e.note==='string'){best=e.note;return event(e,gold);}
  if(e.stage==='step'&&'note' in e&&'accepted' in e&&best!==null){const before=best;if(e.accepted&&typeof e.note==='string')best=e.note;return event(e,gold,noteDiff(before,e.note,e.accepted));}
  return event(e,gold);}).join('');}
function card(r){
  const gold=new Set(r.gold_passage_ids||[]);const st=status(r);
  const metrics=Object.entries(r.metrics||{}).map(([k,v])=>`${esc(k)} ${(100*v).toFixed(1)}`).join(', ');
  const trace=traceHtml(r,gold);
  return `<div class="q ${st}" data-id="${esc(r.id)}"><div><b>${esc(r.id)}</b> [${esc(r.type||'')}] ${esc(r.question)}</div>
   <div>answer: <b>${esc(r.prediction||'')}</b> · gold: ${esc((r.answers||[]).join(' | '))} · ${metrics}
   ${r.error?`<span class="rej"> · failed: ${esc(r.error.type)}: ${esc(r.error.message)}</span>`:''}</div>
   <details><summary>trace (${(r.trace||[]).length} events)</summary>${trace}</details></div>`;}
function filtered(){
  const run=RUNS[+document.getElementById('run').value];const q=document.getElementById('search').value.toLowerCase();
  const st=document.getElementById('status').value;const ty=document.getElementById('type').value;
  return run.records.filter(r=>(!q||JSON.stringify(r).toLowerCase().includes(q))&&(!st||status(r)===st||(st==='fallback'&&(r.stats||{}).fallbacks>0))&&(!ty||r.type===ty));}
function render(){
  const rows=filtered();const pages=Math.max(1,Math.ceil(rows.length/PAGE));page=Math.min(page,pages-1);
  document.getElementById('count').textContent=`${rows.length} questions, page ${page+1} of ${pages}`;
  document.getElementById('list').innerHTML=rows.slice(page*PAGE,(page+1)*PAGE).map(card).join('');}
function move(d){page=Math.max(0,page+d);render();}
function setup(){
  const types=new Set();RUNS.forEach(r=>r.records.forEach(x=>x.type&&types.add(x.type)));
  document.getElementById('type').innerHTML='<option value="">any type</option>'+[...types].sort().map(t=>`<option>${esc(t)}</option>`).join('');
  document.getElementById('run').innerHTML=RUNS.map((r,i)=>`<option value="${i}">${esc(r.label)}</option>`).join('');
  ['run','search','status','type'].forEach(id=>document.getElementById(id).addEventListener('input',()=>{page=0;render();}));
  render();}
setup();
