(function(){
  var T=window.vramscopeTimings={start:performance.now()};
  function fail(msg){var e=document.getElementById('vs-error');e.textContent=msg;e.style.display='block';
    document.querySelectorAll('.chart').forEach(function(c){c.style.display='none';});}
  function painted(){  // resolves once the browser has drawn a frame (at once in a hidden tab)
    if (document.hidden) return Promise.resolve();
    return new Promise(function(r){requestAnimationFrame(function(){setTimeout(r,0);});});}
  function yieldToPage(){  // lets the page scroll and paint between two charts
    if (window.scheduler && scheduler.yield) return scheduler.yield();
    return new Promise(function(r){setTimeout(r,0);});}
  async function loadPlotly(){
    if (window.Plotly) return;
    var src=document.getElementById('vs-plotlyjs');
    if (!src) throw new Error('plotly.js is missing from this file');
    var code;
    if (src.getAttribute('data-encoding')==='gzip+base64'){
      if (typeof DecompressionStream==='undefined')
        throw new Error('the charts need a browser from 2023 or later (Chrome 80, Firefox 113, Safari 16.4); the tables below are complete');
      var text=src.textContent.trim(), bytes;
      if (Uint8Array.fromBase64) bytes=Uint8Array.fromBase64(text);
      else { var raw=atob(text); bytes=new Uint8Array(raw.length);
        for (var i=0;i<raw.length;i++) bytes[i]=raw.charCodeAt(i); }
      var stream=new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
      code=await new Response(stream).text();
    } else { code=src.textContent; }
    T.unpacked=performance.now();
    // Run as a script, not eval(): the compile hint (Chrome 136+, a comment to other
    // browsers) has every function compiled once, up front, instead of pre-parsed and then
    // parsed again when first called (eval ignores it), and opened again the page finds
    // the script compiled in the browser's memory.
    var script=document.createElement('script');
    script.text='//# allFunctionsCalledOnLoad\n'+code;
    document.head.appendChild(script);  // runs it now
    if (!window.Plotly) throw new Error('plotly.js did not start');
    T.plotlyjs=performance.now();
  }
  function distance(el){  // how far a chart is from the visible part of the page, in pixels
    var r=el.getBoundingClientRect(), h=window.innerHeight||document.documentElement.clientHeight;
    return r.bottom<0 ? -r.bottom : r.top>h ? r.top-h : 0;
  }
  async function main(){
    try{
      var figs=JSON.parse(document.getElementById('vs-figures').textContent);
      var config=JSON.parse(document.getElementById('vs-config').textContent);
      var charts=Object.keys(figs).map(function(id){return document.getElementById(id);})
        .filter(function(el){return el;});
      if (!charts.length){ T.first=T.plotted=window.vramscopeReady=performance.now(); return; }
      await loadPlotly();
      function draw(el){
        var f=figs[el.id];
        return Plotly.newPlot(el,f.data,f.layout,config).then(function(){T[el.id]=performance.now();});
      }
      // the first screen (the timeline and every chart in view) first, then the others,
      // nearest to what is on screen first, so a chart scrolled to is drawn next
      var first=charts.filter(function(el){return el.id==='chart-timeline'||distance(el)===0;});
      var rest=charts.filter(function(el){return first.indexOf(el)<0;});
      for (var k=0;k<first.length;k++) await draw(first[k]);
      await painted();
      T.first=window.vramscopeFirstScreen=performance.now();
      while (rest.length){
        await yieldToPage();
        rest.sort(function(a,b){return distance(a)-distance(b);});
        await draw(rest.shift());
      }
      T.plotted=performance.now();
      window.vramscopeReady=T.plotted;
    }catch(err){ fail('Charts could not be drawn: '+err.message); window.vramscopeError=String(err); }
  }
  if (document.readyState==='loading') document.addEventListener('DOMContentLoaded',main); else main();
})();
